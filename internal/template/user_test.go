package template

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/vmm"
)

// fakeStore is a store over fake images (files with the right names) and
// a user directory; enough for everything but baking.
func fakeStore(t *testing.T) *Store {
	t.Helper()
	dir := t.TempDir()
	im := Images{Dir: filepath.Join(dir, "images")}
	os.MkdirAll(filepath.Dir(im.Kernel()), 0o755)
	for _, p := range []string{im.Kernel(), im.Initramfs(), im.Agent(), im.RootFS("tiny")} {
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := NewStore(Config{Dir: filepath.Join(dir, "templates"), Images: im, UserDir: filepath.Join(dir, "rootfs"), Accel: vmm.AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// installUser builds a fake user root filesystem holding content.
func installUser(t *testing.T, st *Store, name, content string) {
	t.Helper()
	dir, err := st.StageUserRootFS(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	u := UserRootFS{Name: name, Source: "127.0.0.1:5000/x:" + content, Image: ImageConfig{Env: []string{"A=" + content}, WorkingDir: "/srv"}, BuiltAt: time.Now()}
	if err := st.InstallUserRootFS(dir, u); err != nil {
		t.Fatal(err)
	}
}

func TestUserRootFSNames(t *testing.T) {
	st := fakeStore(t)
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"app", true}, {"my-app_2", true}, {"base", false}, {"tiny", false},
		{"", false}, {"App", false}, {"-x", false}, {"a/b", false}, {strings.Repeat("a", 33), false},
	} {
		err := st.ValidateUserName(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("ValidateUserName(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateUserName(%q) = %v, want ErrInvalid", tc.name, err)
		}
	}
	if _, err := st.StageUserRootFS("tiny"); !errors.Is(err, ErrInvalid) {
		t.Errorf("StageUserRootFS(tiny) = %v, want ErrInvalid", err)
	}
}

func TestUserRootFSInstallReplaceRemove(t *testing.T) {
	st := fakeStore(t)
	p := Params{Name: "app", MemoryMiB: 256, VCPUs: 1}
	if _, _, err := st.Lookup(p); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup before install: %v, want ErrNotFound", err)
	}
	installUser(t, st, "app", "one")
	if got, want := strings.Join(st.Names(), ","), "app,tiny"; got != want {
		t.Errorf("Names = %s, want %s", got, want)
	}
	if _, reason, err := st.Lookup(p); err != nil || reason != "not baked yet" {
		t.Fatalf("Lookup after install: %q, %v", reason, err)
	}
	u, err := st.UserRootFS("app")
	if err != nil || u.Image.WorkingDir != "/srv" || u.SizeBytes != 3 {
		t.Fatalf("UserRootFS = %+v, %v", u, err)
	}
	in1, err := st.inputs("app")
	if err != nil {
		t.Fatal(err)
	}

	// A template baked from version one (faked: metadata and checksums).
	tdir := filepath.Join(st.cfg.Dir, p.Key())
	os.MkdirAll(tdir, 0o700)
	b, _ := json.Marshal(Meta{Params: p, Inputs: in1})
	os.WriteFile(filepath.Join(tdir, metaFile), b, 0o600)

	installUser(t, st, "app", "two")
	in2, err := st.inputs("app")
	if err != nil {
		t.Fatal(err)
	}
	if in1["rootfs"] == in2["rootfs"] {
		t.Errorf("rootfs hash unchanged by a rebuild")
	}
	if _, reason, err := st.Lookup(p); err != nil || reason != "rootfs changed since the template was baked" {
		t.Errorf("Lookup after rebuild: %q, %v; want stale", reason, err)
	}
	if u, _ := st.UserRootFS("app"); u.Image.Env[0] != "A=two" {
		t.Errorf("config after rebuild: %+v", u)
	}
	vers, _ := filepath.Glob(filepath.Join(st.cfg.UserDir, ".v-app-*"))
	if len(vers) != 1 {
		t.Errorf("versions after rebuild: %q, want one", vers)
	}

	// Leftovers: a staged version never installed.
	if _, err := st.StageUserRootFS("app"); err != nil {
		t.Fatal(err)
	}
	if n := st.RemoveLeftovers(); n != 1 {
		t.Errorf("RemoveLeftovers = %d, want 1", n)
	}
	if _, err := st.UserRootFS("app"); err != nil {
		t.Errorf("leftover removal removed the live version: %v", err)
	}

	if err := st.RemoveUserRootFS("app"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tdir); !os.IsNotExist(err) {
		t.Errorf("baked template survives removal: %v", err)
	}
	if _, _, err := st.Lookup(p); !errors.Is(err, ErrNotFound) {
		t.Errorf("Lookup after removal: %v, want ErrNotFound", err)
	}
	if err := st.RemoveUserRootFS("app"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second removal: %v, want ErrNotFound", err)
	}
	if err := st.RemoveUserRootFS("tiny"); !errors.Is(err, ErrNotFound) {
		t.Errorf("removing a built-in: %v, want ErrNotFound", err)
	}
	if ents, _ := os.ReadDir(st.cfg.UserDir); len(ents) != 1 { // .hashes.json
		t.Errorf("user dir after removal: %v", ents)
	}
}
