package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
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
	st, err := NewStore(Config{Dir: filepath.Join(dir, "templates"), Images: im, UserDir: filepath.Join(dir, "rootfs"), Accel: accel.TCG})
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
	u := templates.UserRootFS{Name: name, Source: "127.0.0.1:5000/x:" + content, Image: templates.ImageConfig{Env: []string{"A=" + content}, WorkingDir: "/srv"}, BuiltAt: time.Now()}
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
		if err != nil && !errors.Is(err, templates.ErrInvalid) {
			t.Errorf("ValidateUserName(%q) = %v, want templates.ErrInvalid", tc.name, err)
		}
	}
	if _, err := st.StageUserRootFS("tiny"); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("StageUserRootFS(tiny) = %v, want templates.ErrInvalid", err)
	}
}

func TestUserRootFSInstallReplaceRemove(t *testing.T) {
	st := fakeStore(t)
	p := templates.Params{Name: "app", MemoryMiB: 256, VCPUs: 1}
	if _, _, err := st.Lookup(p); !errors.Is(err, templates.ErrNotFound) {
		t.Fatalf("Lookup before install: %v, want templates.ErrNotFound", err)
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
	b, _ := json.Marshal(templates.Meta{Params: p, Inputs: in1})
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
	if len(vers) != 2 {
		t.Errorf("versions after rebuild: %q, want two (versions are kept)", vers)
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
	if _, _, err := st.Lookup(p); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("Lookup after removal: %v, want templates.ErrNotFound", err)
	}
	if err := st.RemoveUserRootFS("app"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("second removal: %v, want templates.ErrNotFound", err)
	}
	if err := st.RemoveUserRootFS("tiny"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("removing a built-in: %v, want templates.ErrNotFound", err)
	}
	if ents, _ := os.ReadDir(st.cfg.UserDir); len(ents) != 2 { // .hashes.json, .last-app
		t.Errorf("user dir after removal: %v", ents)
	}
}

func TestUserVersions(t *testing.T) {
	st := fakeStore(t)
	installUser(t, st, "app", "one")
	installUser(t, st, "app", "two")
	installUser(t, st, "app", "three")
	vs, err := st.UserVersions("app")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, fmt.Sprintf("%d:%s", v.Version, v.Image.Env[0]))
	}
	if want := "1:A=one 2:A=two 3:A=three"; strings.Join(got, " ") != want {
		t.Errorf("versions = %s, want %s", strings.Join(got, " "), want)
	}
	if u, err := st.UserRootFS("app"); err != nil || u.Version != 3 {
		t.Errorf("latest = %+v, %v; want version 3", u, err)
	}
	if u, err := st.UserRootFS("app:1"); err != nil || u.Version != 1 || u.Image.Env[0] != "A=one" {
		t.Errorf("app:1 = %+v, %v", u, err)
	}
	for _, ref := range []string{"app:4", "app:0", "app:x", "app:01", "tiny:1"} {
		if _, err := st.UserRootFS(ref); !errors.Is(err, templates.ErrNotFound) {
			t.Errorf("UserRootFS(%s) = %v, want templates.ErrNotFound", ref, err)
		}
	}

	// Each version is baked under its own key: a pinned version's shapes
	// stay fresh whatever the latest becomes.
	p1 := templates.Params{Name: "app:1", MemoryMiB: 256, VCPUs: 1}
	if got, want := p1.Key(), "app.v1-256m-1c"; got != want {
		t.Errorf("Key = %s, want %s", got, want)
	}
	in1, err := st.inputs("app:1")
	if err != nil {
		t.Fatal(err)
	}
	fakeBake(t, st, p1, in1)
	installUser(t, st, "app", "four")
	if _, reason, err := st.Lookup(p1); err != nil || reason != "" {
		t.Errorf("Lookup(app:1) after a new version: %q, %v; want fresh", reason, err)
	}

	// Removing one version: not the latest.
	if err := st.RemoveUserVersion("app", 4); !errors.Is(err, templates.ErrConflict) {
		t.Errorf("removing the latest version: %v, want templates.ErrConflict", err)
	}
	if err := st.RemoveUserVersion("app", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.Lookup(p1); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("Lookup(app:1) after its removal: %v, want templates.ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(st.cfg.Dir, p1.Key())); !os.IsNotExist(err) {
		t.Errorf("shape of a removed version survives: %v", err)
	}
	if err := st.RemoveUserVersion("app", 1); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("removing a removed version: %v, want templates.ErrNotFound", err)
	}
	// Numbers are never reused while the template lives.
	installUser(t, st, "app", "five")
	if u, _ := st.UserRootFS("app"); u.Version != 5 {
		t.Errorf("version after a removal = %d, want 5", u.Version)
	}

	// Leftovers keep the older versions.
	if n := st.RemoveLeftovers(); n != 0 {
		t.Errorf("RemoveLeftovers = %d, want 0", n)
	}
	if vs, _ := st.UserVersions("app"); len(vs) != 4 {
		t.Errorf("versions after RemoveLeftovers: %d, want 4", len(vs))
	}
	if err := st.RemoveUserRootFS("app"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(st.cfg.UserDir); len(ents) != 2 { // .hashes.json, .last-app
		t.Errorf("user dir after removal: %v", ents)
	}
}

func TestUserOwnerAndPublic(t *testing.T) {
	st := fakeStore(t)
	stage := func(name, owner string) {
		dir, err := st.StageUserRootFS(name)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte(owner), 0o644)
		if err := st.InstallUserRootFS(dir, templates.UserRootFS{Name: name, Owner: owner}); err != nil {
			t.Fatal(err)
		}
	}
	published := func(name string) []int {
		t.Helper()
		vs, err := st.UserVersions(name)
		if err != nil {
			t.Fatalf("UserVersions(%s): %v", name, err)
		}
		var out []int
		for _, u := range vs {
			if u.Published {
				out = append(out, u.Version)
			}
		}
		return out
	}
	stage("app", "key-a")
	if got := published("app"); len(got) != 0 {
		t.Errorf("a new template's published versions: %v, want none", got)
	}
	if err := st.SetUserPublished("app", true); err != nil {
		t.Fatal(err)
	}
	// A rebuild keeps the owner, and is not published: publishing
	// granted version 1, not what the owner builds next.
	stage("app", "key-admin")
	for _, tc := range []struct {
		ref       string
		published bool
	}{{"app", false}, {"app:1", true}, {"app:2", false}} {
		u, err := st.UserRootFS(tc.ref)
		if err != nil || u.Owner != "key-a" || u.Published != tc.published {
			t.Errorf("%s = owner %q published %v, %v; want key-a, published %v", tc.ref, u.Owner, u.Published, err, tc.published)
		}
	}
	if got := published("app"); fmt.Sprint(got) != "[1]" {
		t.Errorf("published versions after the rebuild: %v, want [1]", got)
	}
	// NAME publishes the latest; NAME:N that version; the others keep theirs.
	if err := st.SetUserPublished("app", true); err != nil {
		t.Fatal(err)
	}
	stage("app", "key-a")
	if err := st.SetUserPublished("app:3", true); err != nil {
		t.Fatal(err)
	}
	if err := st.SetUserPublished("app:2", false); err != nil {
		t.Fatal(err)
	}
	if got := published("app"); fmt.Sprint(got) != "[1 3]" {
		t.Errorf("published versions: %v, want [1 3]", got)
	}
	// Withdrawing NAME withdraws every version.
	if err := st.SetUserPublished("app", false); err != nil {
		t.Fatal(err)
	}
	if got := published("app"); len(got) != 0 {
		t.Errorf("published versions after withdrawing the template: %v, want none", got)
	}
	for _, ref := range []string{"nope", "app:9", "tiny", "Bad"} {
		if err := st.SetUserPublished(ref, true); !errors.Is(err, templates.ErrNotFound) {
			t.Errorf("publishing %s: %v, want templates.ErrNotFound", ref, err)
		}
	}

	// A config written before versions and owners: version 1, no owner.
	dir, _ := st.StageUserRootFS("old")
	os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, userConfigFile), []byte(`{"name":"old","source":"r/x"}`), 0o600)
	if err := st.pointUser("old", filepath.Base(dir)); err != nil {
		t.Fatal(err)
	}
	if u, err := st.UserRootFS("old"); err != nil || u.Version != 1 || u.Owner != "" || u.DiskBytes == 0 {
		t.Errorf("legacy template = %+v, %v", u, err)
	}
	if u, err := st.UserRootFS("old:1"); err != nil || u.Version != 1 {
		t.Errorf("legacy template old:1 = %+v, %v", u, err)
	}
}

// TestUserLegacyPublic: a template published before versions were
// published one by one (a "public" flag in its configs, copied into every
// version by the installs) counts as its latest version published; the
// next rebuild is not, and the flag is rewritten away.
func TestUserLegacyPublic(t *testing.T) {
	st := fakeStore(t)
	installUser(t, st, "app", "one")
	installUser(t, st, "app", "two")
	// As the code before wrote them: public in both, the older a copy.
	for _, d := range st.versionDirs("app") {
		b, err := os.ReadFile(filepath.Join(d.dir, userConfigFile))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		json.Unmarshal(b, &m)
		m["public"] = true
		b, _ = json.Marshal(m)
		if err := os.WriteFile(filepath.Join(d.dir, userConfigFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string, want map[int]bool) {
		t.Helper()
		vs, err := st.UserVersions("app")
		if err != nil || len(vs) != len(want) {
			t.Fatalf("%s: versions %+v, %v", when, vs, err)
		}
		for _, u := range vs {
			if u.Published != want[u.Version] {
				t.Errorf("%s: app:%d published %v, want %v", when, u.Version, u.Published, want[u.Version])
			}
			if got, _ := st.UserRootFS(templates.Ref("app", u.Version)); got.Published != want[u.Version] {
				t.Errorf("%s: UserRootFS(app:%d).Published = %v, want %v", when, u.Version, got.Published, want[u.Version])
			}
		}
	}
	check("before any change", map[int]bool{1: false, 2: true})
	installUser(t, st, "app", "three")
	check("after a rebuild", map[int]bool{1: false, 2: true, 3: false})
	for _, d := range st.versionDirs("app") {
		if _, legacy, err := readUserConfigLegacy(d.dir); err != nil || legacy {
			t.Errorf("%s still holds the legacy flag (%v)", d.dir, err)
		}
	}
	// Withdrawn, app:1 must not come back through its copied flag.
	if err := st.SetUserPublished("app", false); err != nil {
		t.Fatal(err)
	}
	check("after withdrawing", map[int]bool{1: false, 2: false, 3: false})
}

// fakeBake writes the metadata of a template baked with inputs (no VM).
func fakeBake(t *testing.T, st *Store, p templates.Params, inputs map[string]string) {
	t.Helper()
	tdir := filepath.Join(st.cfg.Dir, p.Key())
	os.MkdirAll(tdir, 0o700)
	b, _ := json.Marshal(templates.Meta{Params: p, Inputs: inputs, Accel: st.cfg.Accel, Cmdline: st.cmdline(), MAC: guestnet.GuestMAC, Machine: vmm.MachineCurrent})
	os.WriteFile(filepath.Join(tdir, metaFile), b, 0o600)
	if _, err := manifest.Seal(tdir, metaFile); err != nil {
		t.Fatal(err)
	}
}

// TestUserVersionsNeverReused: a version number names one build for good:
// removing the template (or a version) does not free its number; a
// failed install's undo does.
func TestUserVersionsNeverReused(t *testing.T) {
	st := fakeStore(t)
	installUser(t, st, "app", "one")
	installUser(t, st, "app", "two")
	if err := st.RemoveUserRootFS("app"); err != nil {
		t.Fatal(err)
	}
	installUser(t, st, "app", "three")
	u, err := st.UserRootFS("app")
	if err != nil || u.Version != 3 {
		t.Fatalf("app after remove and rebuild: %+v, %v; want version 3", u, err)
	}
	if _, err := st.UserRootFS("app:1"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("app:1 after the remove: %v, want templates.ErrNotFound", err)
	}
	dir, err := st.StageUserRootFS("app")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte("four"), 0o644)
	_, undo, err := st.TryUserRootFS(dir, templates.UserRootFS{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	installUser(t, st, "app", "four again")
	if u, err := st.UserRootFS("app"); err != nil || u.Version != 4 {
		t.Errorf("app after an undone install and another: %+v, %v; want version 4", u, err)
	}
}

// TestUserReplica: a copy of a version built elsewhere keeps its number
// and description; an older one does not become the latest; one already
// there is not replaced; a build after them takes the next number.
func TestUserReplica(t *testing.T) {
	st := fakeStore(t)
	replica := func(v int, content string) error {
		t.Helper()
		dir, err := st.StageUserRootFS("web")
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte(content), 0o644)
		err = st.InstallUserReplica(dir, templates.UserRootFS{Name: "web", Version: v, Owner: "k1", Source: content, Image: templates.ImageConfig{WorkingDir: "/w"}})
		if err != nil {
			os.RemoveAll(dir) // the caller's, when refused
		}
		return err
	}
	if err := replica(3, "three"); err != nil {
		t.Fatal(err)
	}
	if err := replica(2, "two"); err != nil {
		t.Fatal(err)
	}
	if err := replica(3, "other"); err != nil {
		t.Fatal(err)
	}
	if err := replica(0, "none"); !errors.Is(err, templates.ErrInvalid) {
		t.Errorf("a copy without a version: %v, want templates.ErrInvalid", err)
	}
	for ref, want := range map[string]string{"web": "three", "web:3": "three", "web:2": "two"} {
		u, err := st.UserRootFS(ref)
		if err != nil || u.Source != want || u.Owner != "k1" || u.Image.WorkingDir != "/w" || !u.Copy {
			t.Errorf("UserRootFS(%s) = %+v, %v; want the copy of %q", ref, u, err, want)
		}
		b, _ := os.ReadFile(st.rootfsPath(ref))
		if string(b) != want {
			t.Errorf("%s's rootfs holds %q, want %q", ref, b, want)
		}
	}
	if n := st.removeUserLeftovers(); n != 0 {
		t.Errorf("removeUserLeftovers removed %d entries of a store of copies", n)
	}
	installUser(t, st, "web", "four")
	if u, err := st.UserRootFS("web"); err != nil || u.Version != 4 {
		t.Errorf("a build after the copies: %+v, %v; want version 4", u, err)
	}

	// A fleet's delete of a version removes the copy even when it is the
	// latest here: the highest one left becomes the latest.
	if err := st.RemoveUserVersion("web", 4); !errors.Is(err, templates.ErrConflict) {
		t.Errorf("RemoveUserVersion of the latest: %v, want templates.ErrConflict", err)
	}
	if err := st.RemoveUserCopy("web", 4); err != nil {
		t.Fatalf("RemoveUserCopy of the latest: %v", err)
	}
	if u, err := st.UserRootFS("web"); err != nil || u.Version != 3 || u.Source != "three" {
		t.Errorf("web after its latest copy was removed: %+v, %v; want version 3", u, err)
	}
	if _, err := st.UserRootFS("web:4"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("web:4 after RemoveUserCopy: %v, want templates.ErrNotFound", err)
	}
	if err := st.RemoveUserCopy("web", 2); err != nil {
		t.Fatalf("RemoveUserCopy of an older version: %v", err)
	}
	if err := st.RemoveUserCopy("web", 7); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("RemoveUserCopy of a version not here: %v, want templates.ErrNotFound", err)
	}
	if err := st.RemoveUserCopy("web", 3); err != nil {
		t.Fatalf("RemoveUserCopy of the last version: %v", err)
	}
	if _, err := st.UserRootFS("web"); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("web after its last copy was removed: %v, want templates.ErrNotFound", err)
	}
	if m, _ := filepath.Glob(filepath.Join(st.cfg.UserDir, ".v-web-*")); len(m) != 0 {
		t.Errorf("version directories left: %v", m)
	}
}
