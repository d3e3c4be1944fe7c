package pandastack_test

// Integration test of volumes against the shared server (see
// integration_test.go): the volume calls and files, a sandbox mounting a
// volume read-write and another read-only, a fork sharing it and a branch
// fork promoted.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

func TestVolumeIntegration(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := fmt.Sprintf("go-%x", suffix)
	vol, err := c.CreateVolume(ctx, name, 16)
	if err != nil {
		t.Fatalf("create volume: %v", err)
	}
	cleanup := func(n string) {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.DeleteVolume(ctx, n, true); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
				t.Errorf("delete volume %s: %v", n, err)
			}
		})
	}
	cleanup(vol.ID)
	if !strings.HasPrefix(vol.ID, "vol_") || vol.Name != name || vol.SizeMiB != 16 || vol.CreatedAt.IsZero() {
		t.Errorf("created %+v", vol)
	}
	_, err = c.CreateVolume(ctx, name, 16)
	wantErr(t, "a second volume of the name", err, pandastack.ErrConflict)
	_, err = c.ResizeVolume(ctx, name, 8)
	wantErr(t, "shrink", err, pandastack.ErrInvalid)

	files := c.VolumeFiles(name)
	if _, err := files.WriteFile(ctx, "/in/a.txt", strings.NewReader("from the api\n"), 0o600); err != nil {
		t.Fatalf("write: %v", err)
	}
	if got := readVolumeFile(t, files, "in/a.txt"); got != "from the api\n" {
		t.Errorf("read back %q", got)
	}
	if fi, err := files.Stat(ctx, "/in/a.txt"); err != nil || fi.Size != 13 || fi.Mode != 0o600 {
		t.Errorf("stat: %+v, %v", fi, err)
	}
	_, err = files.WriteFile(ctx, "/big", strings.NewReader(strings.Repeat("x", 17<<20)), 0)
	wantErr(t, "a write over the size", err, pandastack.ErrInsufficientStorage)
	if _, err := files.Stat(ctx, "/big"); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("the refused write left a file: %v", err)
	}

	// Mounted read-write by one sandbox and read-only by another.
	sb := create(t, c, pandastack.CreateOptions{Volumes: []pandastack.VolumeMount{{Name: name, Path: "/mnt/data"}}})
	ro := create(t, c, pandastack.CreateOptions{Volumes: []pandastack.VolumeMount{{Name: vol.ID, Path: "/data", ReadOnly: true}}})
	if want := (pandastack.VolumeMount{Name: name, Path: "/mnt/data"}); len(sb.Info.Volumes) != 1 || sb.Info.Volumes[0] != want {
		t.Errorf("the sandbox mounts %+v, want %+v", sb.Info.Volumes, want)
	}
	if got := run(t, sb, "cat /mnt/data/in/a.txt && echo guest > /mnt/data/g.txt"); got != "from the api\n" {
		t.Errorf("the sandbox reads %q", got)
	}
	if got := run(t, ro, "cat /data/g.txt"); got != "guest\n" {
		t.Errorf("the read-only sandbox reads %q, want the other's write", got)
	}
	if r, err := ro.Exec(ctx, pandastack.Command{Cmd: "touch /data/nope"}); err != nil || r.ExitCode == 0 {
		t.Errorf("a write to a read-only mount: %+v, %v", r, err)
	}
	if got := readVolumeFile(t, files, "/g.txt"); got != "guest\n" {
		t.Errorf("the API reads %q of the guest's file", got)
	}
	if v, err := c.GetVolume(ctx, name); err != nil || len(v.MountedBy) != 2 {
		t.Errorf("mounted by: %+v, %v", v, err)
	}
	wantErr(t, "delete a mounted volume", c.DeleteVolume(ctx, name, false), pandastack.ErrConflict)

	// A branch fork: the child writes its copy; promote makes it the volume's.
	res, err := sb.ForkWithOptions(ctx, pandastack.ForkOptions{VolumeMode: pandastack.VolumeBranch})
	if err != nil {
		t.Fatalf("fork with branches: %v", err)
	}
	child := res.Children[0]
	t.Cleanup(func() { child.Kill(context.Background()) })
	branch := name + "-" + child.ID
	cleanup(branch)
	if len(child.Info.Volumes) != 1 || child.Info.Volumes[0].Name != branch {
		t.Fatalf("the child mounts %+v, want %s", child.Info.Volumes, branch)
	}
	run(t, child, "echo branch > /mnt/data/g.txt")
	if got := readVolumeFile(t, files, "/g.txt"); got != "guest\n" {
		t.Errorf("the volume after the branch's write: %q, want it unchanged", got)
	}
	if err := child.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ro.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := c.PromoteVolume(ctx, branch)
	if err != nil {
		t.Fatalf("promote: %v", err)
	}
	if p.ID != vol.ID {
		t.Errorf("promote answered %+v, want the parent %s", p, vol.ID)
	}
	if got := readVolumeFile(t, files, "/g.txt"); got != "branch\n" {
		t.Errorf("the volume after promote: %q, want the branch's", got)
	}
	_, err = c.GetVolume(ctx, branch)
	wantErr(t, "the promoted branch", err, pandastack.ErrNotFound)
	_, err = c.PromoteVolume(ctx, name)
	wantErr(t, "promote a volume without a parent", err, pandastack.ErrInvalid)
}

func readVolumeFile(t *testing.T, f *pandastack.VolumeFiles, p string) string {
	t.Helper()
	rc, err := f.ReadFile(testCtx(t), p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(b)
}

// run runs cmd in sb and returns its stdout, failing the test on a non-zero exit.
func run(t *testing.T, sb *pandastack.Sandbox, cmd string) string {
	t.Helper()
	r, err := sb.Exec(testCtx(t), pandastack.Command{Cmd: cmd})
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("exec %q: %+v, %v", cmd, r, err)
	}
	return r.Stdout
}
