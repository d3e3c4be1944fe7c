package cli

// Integration test of `panda volume`, `panda create --volume` and `panda
// fork --volumes branch` against the package's shared server
// (pandatest.Shared, see integration_test.go): one test, two sandboxes (a
// parent and its branch child), to keep the suite's time.

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVolumeCLIIntegration(t *testing.T) {
	itEnv(t)
	name := fmt.Sprintf("cli-%x", randBytes(4))
	r := mustRun(t, "", "volume", "create", name, "--size", "16")
	if r.stdout != name+"\n" {
		t.Fatalf("volume create: got %q, want the name", r.stdout)
	}
	t.Cleanup(func() { runCLI(itCtx(t), "", "volume", "rm", "--force", name) })

	// Files through the API, before any sandbox.
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	data := randBytes(1<<20 + 7)
	if err := os.WriteFile(src, data, 0o640); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "", "volume", "put", name, src, "/in/")
	mustRun(t, "first\n", "volume", "put", name, "-", "/note.txt")
	r = mustRun(t, "", "volume", "ls-files", name, "/in")
	if !strings.Contains(r.stdout, "src.bin") || !strings.Contains(r.stdout, "-rw-r-----") {
		t.Errorf("volume ls-files: got %q", r.stdout)
	}
	r = mustRun(t, "", "volume", "info", name, "--json")
	var v struct {
		ID        string   `json:"id"`
		SizeMiB   int      `json:"size_mib"`
		UsedBytes int64    `json:"used_bytes"`
		MountedBy []string `json:"mounted_by"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || !strings.HasPrefix(v.ID, "vol_") || v.SizeMiB != 16 || v.UsedBytes < int64(len(data)) {
		t.Errorf("volume info --json: got %q (%v)", r.stdout, err)
	}
	r = runCLI(itCtx(t), "", "volume", "resize", name, "--size", "8")
	if r.err == nil {
		t.Error("volume resize to a smaller size: got no error")
	}
	mustRun(t, "", "volume", "resize", name, "--size", "32")

	// A sandbox mounting it sees the files, and its writes reach the API.
	id := createSandbox(t, "--volume", name+":/mnt/data")
	r = mustRun(t, "", "exec", id, "--", "sh", "-c", "cat /mnt/data/note.txt && echo from-guest > /mnt/data/guest.txt")
	if r.stdout != "first\n" {
		t.Errorf("exec cat: got %q, want the file put through the API", r.stdout)
	}
	r = mustRun(t, "", "volume", "get", name, "/guest.txt", "-")
	if r.stdout != "from-guest\n" {
		t.Errorf("volume get of the guest's file: got %q", r.stdout)
	}
	r = mustRun(t, "", "get", id)
	if !strings.Contains(r.stdout, name+":/mnt/data") {
		t.Errorf("get: got %q, want the mount", r.stdout)
	}
	r = runCLI(itCtx(t), "", "volume", "rm", name)
	if r.err == nil || !strings.Contains(r.stderr, "--force") {
		t.Errorf("volume rm of a mounted volume: got %v %q, want a conflict with a hint", r.err, r.stderr)
	}

	// A branch fork writes its own copy; promote makes it the volume's.
	r = mustRun(t, "", "fork", id, "--volumes", "branch")
	child := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { runCLI(itCtx(t), "", "kill", child) })
	branch := name + "-" + child
	t.Cleanup(func() { runCLI(itCtx(t), "", "volume", "rm", "--force", branch) })
	mustRun(t, "", "exec", child, "--", "sh", "-c", "echo second > /mnt/data/note.txt")
	r = mustRun(t, "", "volume", "get", name, "/note.txt", "-")
	if r.stdout != "first\n" {
		t.Errorf("the parent's volume after the branch's write: got %q, want it unchanged", r.stdout)
	}
	r = mustRun(t, "", "volume", "ls")
	if !strings.Contains(r.stdout, branch) {
		t.Errorf("volume ls: got %q, want the branch %s", r.stdout, branch)
	}
	mustRun(t, "", "kill", child)
	mustRun(t, "", "volume", "promote", branch)
	r = mustRun(t, "", "volume", "get", name, "/note.txt", "-")
	if r.stdout != "second\n" {
		t.Errorf("the volume after promote: got %q, want the branch's file", r.stdout)
	}
	dst := filepath.Join(dir, "back.bin")
	mustRun(t, "", "volume", "get", name, "/in/src.bin", dst)
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, data) {
		t.Errorf("volume get after promote: got %d bytes (%v), want the %d put", len(b), err, len(data))
	}
	r = runCLI(itCtx(t), "", "volume", "info", branch)
	if r.err == nil || !strings.Contains(r.err.Error(), "not_found") {
		t.Errorf("volume info of a promoted branch: got %v, want not_found", r.err)
	}

	mustRun(t, "", "volume", "rm", "--force", name)
	r = runCLI(itCtx(t), "", "volume", "info", name)
	if r.err == nil {
		t.Error("volume info after rm: got no error")
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
