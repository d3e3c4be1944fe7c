package hostagent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestUserTemplateFromAnotherHost: a version of a user template one host
// installed and published starts sandboxes on another host that shares
// the object store: that host fetches it under the same number, with its
// image's defaults; a version the store lacks is not found; unpublishing
// removes the set.
func TestUserTemplateFromAnotherHost(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("usertemplates")
	openA, cs := storeHost(t, objs)
	openB, _ := storeHost(t, objs)
	a, b := openA(), openB()

	// Host A installs app:1 (tiny's root filesystem, an image env of its
	// own) and publishes it, as a build does.
	dir, err := a.Templates().StageUserRootFS("app")
	if err != nil {
		t.Fatal(err)
	}
	cp := exec.Command("cp", "--reflink=auto", "--sparse=always", filepath.Join(testkit.Images(), "rootfs-tiny.ext4"), filepath.Join(dir, diskFile))
	if out, err := cp.CombinedOutput(); err != nil {
		t.Fatalf("copy tiny's root filesystem: %v: %s", err, out)
	}
	if err := a.Templates().InstallUserRootFS(dir, templates.UserRootFS{Name: "app", Version: 1, Source: "test", Owner: "k1",
		Image: templates.ImageConfig{Env: []string{"MARK=built-on-a"}, WorkingDir: "/tmp"}}); err != nil {
		t.Fatal(err)
	}
	u, err := a.Templates().UserRootFS("app")
	if err != nil || u.Version != 1 {
		t.Fatalf("app on host A: %+v, %v", u, err)
	}
	if err := a.PublishUserTemplate(ctxT(t), u, dir); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if !hasManifest(cs, "userfs/app/v1") {
		t.Fatal("no set userfs/app/v1 in the store after the publish")
	}

	// Host B has never seen it: a create of app:1 fetches it.
	if _, err := b.Templates().UserRootFS("app:1"); !errors.Is(err, templates.ErrNotFound) {
		t.Fatalf("app:1 on host B before any create: %v, want ErrNotFound", err)
	}
	sb, err := b.Create(ctxT(t), CreateRequest{Template: "app:1"})
	if err != nil {
		t.Fatalf("create app:1 on host B: %v", err)
	}
	t.Cleanup(func() { b.Kill(context.Background(), sb.ID) })
	if got := shOn(t, b, sb.ID, `echo "$MARK $(pwd)"`); got != "built-on-a /tmp\n" {
		t.Errorf("sandbox of app:1 on host B: MARK and cwd %q, want the image's of host A", got)
	}
	ub, err := b.Templates().UserRootFS("app:1")
	if err != nil || ub.Version != 1 || ub.Owner != "k1" || ub.SizeBytes != u.SizeBytes {
		t.Errorf("host B's copy of app:1: %+v, %v; want version 1 of k1, %d bytes", ub, err, u.SizeBytes)
	}

	// A version nobody published is not found, on either host.
	if _, err := b.Create(ctxT(t), CreateRequest{Template: "app:2"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("create app:2 on host B: %v, want ErrNotFound", err)
	}

	if err := a.UnpublishUserTemplate(ctxT(t), "app", []int{1}); err != nil {
		t.Fatal(err)
	}
	if hasManifest(cs, "userfs/app/v1") {
		t.Error("userfs/app/v1 still in the store after the unpublish")
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("host A's own version after the unpublish: %v", err)
	}

	// Host B was away when app was deleted: at its next start it sweeps
	// the copy whose set is gone, with its bakes; a copy whose set is
	// there stays, and so does a version that is not a fleet's copy.
	dir2, err := a.Templates().StageUserRootFS("app")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir2, diskFile), []byte("v2"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Templates().InstallUserRootFS(dir2, templates.UserRootFS{Name: "app", Version: 2, Source: "test"}); err != nil {
		t.Fatal(err)
	}
	// Host B's own template from before it joined a fleet: not a copy,
	// kept.
	dir3, err := b.Templates().StageUserRootFS("mine")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir3, diskFile), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Templates().InstallUserRootFS(dir3, templates.UserRootFS{Name: "mine", Source: "test"}); err != nil {
		t.Fatal(err)
	}
	u2, err := a.Templates().UserRootFS("app:2")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.PublishUserTemplate(ctxT(t), u2, dir2); err != nil {
		t.Fatal(err)
	}
	if n, err := a.SweepUserCopies(ctxT(t)); err != nil || n != 1 {
		t.Errorf("host A's sweep: %d, %v; want app:1 (unpublished) removed", n, err)
	}
	if u, err := a.Templates().UserRootFS("app"); err != nil || u.Version != 2 {
		t.Errorf("host A's app after its sweep: %+v, %v; want version 2 kept", u, err)
	}
	b.Kill(context.Background(), sb.ID)
	if n, err := b.SweepUserCopies(ctxT(t)); err != nil || n != 1 {
		t.Errorf("host B's sweep: %d, %v; want its copy of app:1 removed", n, err)
	}
	if _, err := b.Templates().UserRootFS("app"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("host B's app after its sweep: %v, want ErrNotFound", err)
	}
	if _, err := b.Templates().UserRootFS("mine"); err != nil {
		t.Errorf("host B's own template after its sweep: %v, want it kept", err)
	}
	if ts, err := b.Templates().List(); err != nil || slices.ContainsFunc(ts, func(tp template.Template) bool { return strings.HasPrefix(tp.Name, "app") }) {
		t.Errorf("host B's bakes after its sweep: %v, %v; want none of app", ts, err)
	}
}
