package cli

// Integration tests of the verbs against a real server: `panda up` with its
// own data directory on a free port, QEMU with TCG, template tiny at
// 256 MiB. The server (pandatest.Shared) is started on first use and
// stopped by TestMain; the unit tests of this package do not need it.
//
// Environment: PANDA_BIN (default: build ./cmd/panda), PANDA_TEST_IMAGES
// (default /var/lib/pandastack/images, from `make setup`).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// --- helpers ---

// itEnv points the CLI at the shared test server with its admin key.
func itEnv(t *testing.T) *pandatest.Server {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t) // panda up loop-mounts an XFS image
	s, err := pandatest.Shared()
	if err != nil {
		t.Fatalf("cannot start the server: %v", err)
	}
	t.Setenv("PANDASTACK_API_URL", s.URL())
	t.Setenv("PANDASTACK_API_KEY", s.AdminKey())
	t.Setenv("PANDA_DATA_DIR", t.TempDir())
	return s
}

func itCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// mustRun runs the CLI and fails the test on an error.
func mustRun(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	r := runCLI(itCtx(t), stdin, args...)
	if r.err != nil {
		t.Fatalf("panda %s: %v\nstderr: %s", strings.Join(args, " "), r.err, r.stderr)
	}
	return r
}

// createSandbox runs `panda create --json` for a tiny sandbox, killed at
// the end of the test.
func createSandbox(t *testing.T, extra ...string) string {
	t.Helper()
	r := mustRun(t, "", append([]string{"create", "--json", "--template", "tiny", "--memory", "256"}, extra...)...)
	var sb struct {
		ID    string `json:"id"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &sb); err != nil || sb.ID == "" || sb.State != "running" {
		t.Fatalf("create --json: got %q (%v), want a running sandbox object", r.stdout, err)
	}
	t.Cleanup(func() { runCLI(context.Background(), "", "kill", sb.ID) })
	return sb.ID
}

// --- tests ---

func TestIntegrationLifecycle(t *testing.T) {
	itEnv(t)
	run := fmt.Sprint(time.Now().UnixNano())
	id := createSandbox(t, "--meta", "run="+run, "--ttl", "600")

	// Plain create prints only the id.
	r := mustRun(t, "", "create", "--template", "tiny", "--memory", "256", "--meta", "run="+run)
	id2 := strings.TrimSpace(r.stdout)
	t.Cleanup(func() { runCLI(context.Background(), "", "kill", id2) })
	if strings.ContainsAny(id2, " \n\t") || id2 == "" || id2 == id {
		t.Errorf("create: got %q, want one new id", r.stdout)
	}

	r = mustRun(t, "", "get", id, "--json")
	var got struct {
		ID       string            `json:"id"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.ID != id || got.Metadata["run"] != run {
		t.Errorf("get --json: got %q (%v)", r.stdout, err)
	}
	r = mustRun(t, "", "get", id)
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "running") {
		t.Errorf("get: got %q", r.stdout)
	}

	r = mustRun(t, "", "ls", "--meta", "run="+run, "--json")
	var list struct {
		Sandboxes []struct {
			ID string `json:"id"`
		} `json:"sandboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Sandboxes) != 2 || list.Sandboxes[0].ID != id || list.Sandboxes[1].ID != id2 {
		t.Errorf("ls --json: got %q (%v), want both sandboxes, oldest first", r.stdout, err)
	}
	r = mustRun(t, "", "ls", "--meta", "run="+run)
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "run="+run) {
		t.Errorf("ls: got %q", r.stdout)
	}

	r = mustRun(t, "", "ttl", id, "120")
	if !strings.Contains(r.stdout, "expires at") {
		t.Errorf("ttl: got %q", r.stdout)
	}

	r = mustRun(t, "", "kill", id, id2)
	if r.stdout != id+"\n"+id2+"\n" {
		t.Errorf("kill: got %q", r.stdout)
	}
	r = mustRun(t, "", "ls", "--meta", "run="+run, "--json")
	if strings.Contains(r.stdout, id) {
		t.Errorf("ls after kill: got %q, want no killed sandboxes", r.stdout)
	}
	r = mustRun(t, "", "ls", "--meta", "run="+run, "--state", "stopped")
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "killed") {
		t.Errorf("ls --state stopped: got %q", r.stdout)
	}

	r = runCLI(itCtx(t), "", "get", "nosuchsandbox0")
	if r.exitCode() != 1 || r.err == nil || !strings.Contains(r.err.Error(), "not_found") {
		t.Errorf("get unknown: got exit %d, %v", r.exitCode(), r.err)
	}
}

func TestIntegrationExec(t *testing.T) {
	itEnv(t)
	id := createSandbox(t, "--env", "FROM_CREATE=c1")
	ctx := itCtx(t)

	tests := []struct {
		name       string
		stdin      string
		args       []string
		wantOut    string
		wantErr    string
		wantStatus int
	}{
		{"shell string", "", []string{"--", "echo out; echo err >&2; exit 7"}, "out\n", "err\n", 7},
		{"argv", "", []string{"--", "printf", "%s|", "a b", "c"}, "a b|c|", "", 0},
		{"env and cwd", "", []string{"--env", "A=1", "--cwd", "/tmp", "--", `echo "$A $FROM_CREATE $(pwd)"`}, "1 c1 /tmp\n", "", 0},
		{"stdin", "hello", []string{"-i", "--", "cat"}, "hello", "", 0},
		{"exit 0", "", []string{"--", "true"}, "", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(ctx, tt.stdin, append([]string{"exec", id}, tt.args...)...)
			if r.exitCode() != tt.wantStatus || r.stdout != tt.wantOut || r.stderr != tt.wantErr {
				t.Errorf("got exit %d (%v) stdout %q stderr %q, want %d %q %q", r.exitCode(), r.err, r.stdout, r.stderr, tt.wantStatus, tt.wantOut, tt.wantErr)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		r := runCLI(ctx, "", "exec", id, "--timeout", "1", "--", "sleep 30")
		if r.exitCode() == 0 || !strings.Contains(r.stderr, "timed out") {
			t.Errorf("got exit %d stderr %q, want a non-zero exit and a note", r.exitCode(), r.stderr)
		}
	})
	t.Run("json", func(t *testing.T) {
		r := runCLI(ctx, "", "exec", "--json", id, "--", "echo hi; exit 2")
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.ExitCode != 2 || res.Stdout != "hi\n" || r.exitCode() != 2 {
			t.Errorf("got %q (%v) exit %d", r.stdout, err, r.exitCode())
		}
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		r := runCLI(ctx, "", "exec", "nosuchsandbox0", "--", "true")
		if r.exitCode() != 1 || r.err == nil || !strings.Contains(r.err.Error(), "not_found") {
			t.Errorf("got exit %d %v", r.exitCode(), r.err)
		}
	})
}

// TestIntegrationBinary runs the real panda binary: the verbs must be
// wired into main and exec's status must become the process's.
func TestIntegrationBinary(t *testing.T) {
	itEnv(t)
	id := createSandbox(t)
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		cmd := exec.CommandContext(itCtx(t), bin, args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("run panda: %v", err)
		}
		return out.String(), errb.String(), cmd.ProcessState.ExitCode()
	}
	out, errs, code := run("exec", id, "--", "echo hi; exit 5")
	if out != "hi\n" || errs != "" || code != 5 {
		t.Errorf("panda exec: got stdout %q stderr %q status %d, want hi, nothing, 5", out, errs, code)
	}
	out, errs, code = run("get", "nosuchsandbox0")
	if code != 1 || out != "" || !strings.HasPrefix(errs, "panda: ") || strings.Contains(errs, "goroutine") {
		t.Errorf("panda get unknown: got stdout %q stderr %q status %d, want a one-line error and status 1", out, errs, code)
	}
}

func TestIntegrationFiles(t *testing.T) {
	itEnv(t)
	id := createSandbox(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	if err := os.WriteFile(src, data, 0o750); err != nil {
		t.Fatal(err)
	}

	r := mustRun(t, "", "fs", "put", id, src, "/work/in/", "--json")
	var fi struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
		Mode uint32 `json:"mode"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &fi); err != nil || fi.Path != "/work/in/src.bin" || fi.Size != int64(len(data)) || fi.Mode != 0o750 {
		t.Errorf("fs put --json: got %q (%v), want /work/in/src.bin, its size and mode 0750", r.stdout, err)
	}

	dst := filepath.Join(dir, "dst.bin")
	mustRun(t, "", "fs", "get", id, "/work/in/src.bin", dst)
	if b, err := os.ReadFile(dst); err != nil || !bytes.Equal(b, data) {
		t.Errorf("fs get to a file: got %d bytes (%v), want the %d uploaded", len(b), err, len(data))
	}
	r = mustRun(t, "", "fs", "get", id, "/work/in/src.bin", "-")
	if r.stdout != string(data) {
		t.Errorf("fs get to stdout: got %d bytes, want the %d uploaded", len(r.stdout), len(data))
	}
	mustRun(t, "from stdin", "fs", "put", id, "-", "/work/in/stdin.txt")
	r = mustRun(t, "", "fs", "get", id, "/work/in/stdin.txt", "-")
	if r.stdout != "from stdin" {
		t.Errorf("fs put from stdin: got %q back", r.stdout)
	}

	mustRun(t, "", "fs", "mkdir", id, "/work/in/sub/dir")
	r = mustRun(t, "", "fs", "ls", id, "/work/in", "--json")
	var ls struct {
		Entries []struct {
			Name  string `json:"name"`
			IsDir bool   `json:"is_dir"`
		} `json:"entries"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ls); err != nil || len(ls.Entries) != 3 || ls.Entries[0].Name != "src.bin" || ls.Entries[1].Name != "stdin.txt" || !ls.Entries[2].IsDir {
		t.Errorf("fs ls --json: got %q (%v)", r.stdout, err)
	}
	r = mustRun(t, "", "fs", "ls", id, "/work/in")
	if !strings.Contains(r.stdout, "sub/") || !strings.Contains(r.stdout, "-rwxr-x---") {
		t.Errorf("fs ls: got %q", r.stdout)
	}

	r = runCLI(itCtx(t), "", "fs", "rm", id, "/work/in")
	if r.err == nil {
		t.Error("fs rm of a non-empty directory without -r: got no error")
	}
	mustRun(t, "", "fs", "rm", "-r", id, "/work/in")
	r = runCLI(itCtx(t), "", "fs", "get", id, "/work/in/src.bin", filepath.Join(dir, "again"))
	if r.err == nil || !strings.Contains(r.err.Error(), "not_found") {
		t.Errorf("fs get of a removed file: got %v, want not_found", r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "again")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed fs get left a local file (%v)", err)
	}
}

func TestIntegrationKeysAndTemplates(t *testing.T) {
	s := itEnv(t)
	r := mustRun(t, "", "keys", "create", "cli-test", "--max-sandboxes", "2", "--json")
	var k struct {
		ID           string `json:"id"`
		Key          string `json:"key"`
		MaxSandboxes int    `json:"max_sandboxes"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &k); err != nil || k.ID == "" || k.Key == "" || k.MaxSandboxes != 2 {
		t.Fatalf("keys create --json: got %q (%v)", r.stdout, err)
	}
	if !strings.Contains(r.stderr, "not shown again") {
		t.Errorf("keys create: got stderr %q, want a warning to store the secret", r.stderr)
	}
	r = mustRun(t, "", "keys", "ls")
	if !strings.Contains(r.stdout, k.ID) || strings.Contains(r.stdout, k.Key) {
		t.Errorf("keys ls: got %q, want the key's id and not its secret", r.stdout)
	}

	// The new key works, and is not an admin.
	r = runCLI(itCtx(t), "", "keys", "ls", "--api-key", k.Key)
	if r.err == nil || !strings.Contains(r.err.Error(), "forbidden") {
		t.Errorf("keys ls with a user key: got %v, want forbidden", r.err)
	}
	mustRun(t, "", "ls", "--api-key", k.Key)

	mustRun(t, "", "keys", "revoke", k.ID)
	r = runCLI(itCtx(t), "", "ls", "--api-key", k.Key)
	if r.err == nil || !strings.Contains(r.err.Error(), "unauthorized") {
		t.Errorf("ls with a revoked key: got %v, want unauthorized", r.err)
	}

	r = mustRun(t, "", "template", "ls", "--json")
	var ts struct {
		Templates []struct {
			Name string `json:"name"`
		} `json:"templates"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ts); err != nil || !strings.Contains(r.stdout, `"tiny"`) {
		t.Errorf("template ls --json: got %q (%v), want tiny listed", r.stdout, err)
	}
	r = mustRun(t, "", "template", "ls")
	if !strings.Contains(r.stdout, "tiny") {
		t.Errorf("template ls: got %q", r.stdout)
	}

	// No key anywhere: the local server's admin key file is used.
	t.Setenv("PANDASTACK_API_KEY", "")
	t.Setenv("PANDA_DATA_DIR", s.DataDir())
	mustRun(t, "", "keys", "ls")
}

func TestIntegrationPorts(t *testing.T) {
	s := itEnv(t)
	id := createSandbox(t)
	mustRun(t, "", "exec", id, "--", "mkdir -p /tmp/www && httpd -p 8000 -h /tmp/www")
	var ports struct {
		Ports []struct {
			Port    int    `json:"port"`
			Address string `json:"address"`
		} `json:"ports"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for found := false; !found; {
		r := mustRun(t, "", "port", "ls", id, "--json")
		if err := json.Unmarshal([]byte(r.stdout), &ports); err != nil {
			t.Fatalf("port ls --json: %q: %v", r.stdout, err)
		}
		for _, p := range ports.Ports {
			found = found || p.Port == 8000
		}
		if !found && time.Now().After(deadline) {
			t.Fatalf("port ls: got %+v, want 8000 within 30 s", ports)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if r := mustRun(t, "", "port", "ls", id); !strings.Contains(r.stdout, "8000") {
		t.Errorf("port ls: got %q", r.stdout)
	}
	r := mustRun(t, "", "port", id, "8000", "--ttl", "2m")
	if u := strings.TrimSpace(r.stdout); !strings.HasPrefix(u, s.URL()+"/p/") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("port: got %q, want one line %s/p/…", r.stdout, s.URL())
	}
	if r := runCLI(itCtx(t), "", "port", id, "8000", "--ttl", "48h"); r.err == nil || !strings.Contains(r.err.Error(), "ttl_seconds") {
		t.Errorf("port --ttl 48h: got %v, want the server's refusal", r.err)
	}
}

func TestIntegrationNetwork(t *testing.T) {
	itEnv(t)
	if r := runCLI(itCtx(t), "", "create", "--template", "tiny", "--memory", "256", "--allow-out", "bad entry!"); r.err == nil || !strings.Contains(r.err.Error(), `"bad entry!"`) {
		t.Errorf("create with a bad entry: got %v, want the server's refusal naming the entry", r.err)
	}
	id := createSandbox(t, "--no-internet", "--allow-out", "pypi.org", "--allow-out", "10.1.0.0/16")
	policy := func(args ...string) string {
		t.Helper()
		r := mustRun(t, "", append([]string{"network", id, "--json"}, args...)...)
		var n struct {
			Internet bool     `json:"internet"`
			AllowOut []string `json:"allow_out"`
			DenyOut  []string `json:"deny_out"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &n); err != nil {
			t.Fatalf("network --json: %q: %v", r.stdout, err)
		}
		return fmt.Sprintf("internet=%v allow=%q deny=%q", n.Internet, n.AllowOut, n.DenyOut)
	}
	if got, want := policy(), `internet=false allow=["pypi.org" "10.1.0.0/16"] deny=[]`; got != want {
		t.Errorf("after create: got %s, want %s", got, want)
	}
	// The flags given replace their part, the others stay.
	want := `internet=true allow=["pypi.org" "10.1.0.0/16"] deny=["*.example.com"]`
	if got := policy("--internet=true", "--deny-out", "*.example.com"); got != want {
		t.Errorf("network --internet=true --deny-out: got %s, want %s", got, want)
	}
	if r := runCLI(itCtx(t), "", "network", id, "--deny-out", "300.1.2.3/8"); r.err == nil || !strings.Contains(r.err.Error(), `deny_out entry "300.1.2.3/8"`) {
		t.Errorf("network with a bad entry: got %v, want the server's refusal naming the entry", r.err)
	}
	if got := policy(); got != want {
		t.Errorf("after a refused change: got %s, want %s unchanged", got, want)
	}
	r := mustRun(t, "", "get", id)
	if !strings.Contains(r.stdout, "internet; allow pypi.org,10.1.0.0/16; deny *.example.com") {
		t.Errorf("get: got %q, want the policy on the network line", r.stdout)
	}
}
