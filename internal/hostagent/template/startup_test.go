package template

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template/codeinterp"
)

// A template's start and ready commands are part of its identity: the
// same root filesystem installed with other commands makes its baked
// shapes stale; the ready timeout does not.
func TestStartupIsIdentity(t *testing.T) {
	st := fakeStore(t)
	p := templates.Params{Name: "app", MemoryMiB: 256, VCPUs: 1}
	install := func(su templates.Startup) map[string]string {
		t.Helper()
		dir, err := st.StageUserRootFS("app")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte("same"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := st.InstallUserRootFS(dir, templates.UserRootFS{Name: "app", Startup: su, BuiltAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		in, err := st.inputs("app")
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	fakeBake := func(in map[string]string) {
		t.Helper()
		tdir := filepath.Join(st.cfg.Dir, p.Key())
		os.MkdirAll(tdir, 0o700)
		b, _ := json.Marshal(templates.Meta{Params: p, Inputs: in, Accel: st.cfg.Accel, Cmdline: st.cmdline()})
		if err := os.WriteFile(filepath.Join(tdir, metaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const changed = "its start or ready command changed since it was baked"
	stale := func(want bool) {
		t.Helper()
		_, reason, err := st.Lookup(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := reason == changed; got != want {
			t.Errorf("Lookup: reason %q; want stale for its commands: %v", reason, want)
		}
	}

	in := install(templates.Startup{})
	if _, ok := in["startup"]; ok {
		t.Errorf("inputs of a template without commands: %v, want no startup", in)
	}
	fakeBake(in)
	stale(false)

	su := templates.Startup{StartCmd: "exec server", ReadyCmd: "check"}
	in = install(su)
	if in["startup"] == "" {
		t.Fatalf("inputs with commands: %v, want a startup hash", in)
	}
	stale(true)
	fakeBake(in)
	stale(false)

	su.ReadyTimeoutSeconds = 5
	install(su)
	stale(false)
	su.ReadyCmd = "check2"
	install(su)
	stale(true)
	if u, err := st.UserRootFS("app"); err != nil || u.Startup != su {
		t.Errorf("UserRootFS = %+v, %v; want its startup %+v", u, err, su)
	}
	g, err := st.startupOf("app")
	if err != nil || g.Startup != su {
		t.Errorf("startupOf = %+v, %v", g, err)
	}
	if g, _ := st.startupOf("tiny"); !g.IsZero() {
		t.Errorf("startupOf(tiny) = %+v, want nothing", g)
	}
}

// TryUserRootFS installs a version that keep makes final and undo takes
// back: to the version it replaced, or to no template at all.
func TestTryUserRootFS(t *testing.T) {
	st := fakeStore(t)
	try := func(content string) (func(), func() error) {
		t.Helper()
		dir, err := st.StageUserRootFS("app")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "rootfs.ext4"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		keep, undo, err := st.TryUserRootFS(dir, templates.UserRootFS{Name: "app", Source: content})
		if err != nil {
			t.Fatal(err)
		}
		if u, err := st.UserRootFS("app"); err != nil || u.Source != content {
			t.Fatalf("UserRootFS while trying %s: %+v, %v", content, u, err)
		}
		return keep, undo
	}
	versions := func() int {
		m, _ := filepath.Glob(filepath.Join(st.cfg.UserDir, ".v-app-*"))
		return len(m)
	}

	_, undo := try("one")
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UserRootFS("app"); !errors.Is(err, templates.ErrNotFound) || versions() != 0 {
		t.Errorf("after undoing the first version: %v, %d versions; want none", err, versions())
	}

	keep, _ := try("one")
	keep()
	keep, undo = try("two")
	if versions() != 2 {
		t.Errorf("while trying: %d versions, want 2", versions())
	}
	if err := undo(); err != nil {
		t.Fatal(err)
	}
	if u, err := st.UserRootFS("app"); err != nil || u.Source != "one" || versions() != 1 {
		t.Errorf("after undo: %+v, %v, %d versions; want one, 1", u, err, versions())
	}
	keep, _ = try("three")
	keep()
	if u, err := st.UserRootFS("app"); err != nil || u.Source != "three" || u.Version != 2 || versions() != 2 {
		t.Errorf("after keep: %+v, %v, %d versions; want three as version 2, 2 versions (the older kept)", u, err, versions())
	}
}

// The built-in code-interpreter's bake writes the code server's files and
// starts it as user "user"; their hash is its "files" input and its
// commands its "startup" input, so a change to either re-bakes it. The
// other built-ins start nothing and keep their inputs.
func TestCodeInterpreterStartup(t *testing.T) {
	st := fakeStore(t)
	if err := os.WriteFile(st.cfg.Images.RootFS(templates.CodeInterpreter), []byte("ci"), 0o644); err != nil {
		t.Fatal(err)
	}
	g, err := st.startupOf(templates.CodeInterpreter)
	if err != nil {
		t.Fatal(err)
	}
	if g.Startup != codeinterp.Startup() || g.User != codeinterp.User || g.Cwd != codeinterp.Home {
		t.Errorf("startupOf(code-interpreter) = %+v, want codeinterp's startup as %s in %s", g, codeinterp.User, codeinterp.Home)
	}
	if len(g.Files) == 0 || g.FilesHash != codeinterp.Hash() {
		t.Errorf("startupOf(code-interpreter): %d files, hash %q; want codeinterp's files and hash", len(g.Files), g.FilesHash)
	}
	in, err := st.inputs(templates.CodeInterpreter)
	if err != nil {
		t.Fatal(err)
	}
	if in["files"] != codeinterp.Hash() || in["startup"] != startupHash(codeinterp.Startup()) {
		t.Errorf("inputs(code-interpreter) = %v, want files %s and the startup's hash", in, codeinterp.Hash())
	}

	// A template baked with other files is stale for them.
	p := templates.Params{Name: templates.CodeInterpreter, MemoryMiB: 512, VCPUs: 1}
	old := maps.Clone(in)
	old["files"] = "an older server"
	tdir := filepath.Join(st.cfg.Dir, p.Key())
	os.MkdirAll(tdir, 0o700)
	b, _ := json.Marshal(templates.Meta{Params: p, Inputs: old, Accel: st.cfg.Accel, Cmdline: st.cmdline()})
	if err := os.WriteFile(filepath.Join(tdir, metaFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, reason, err := st.Lookup(p); err != nil || !strings.Contains(reason, "files") {
		t.Errorf("Lookup of a template baked with other files: reason %q, err %v; want stale for its files", reason, err)
	}

	g, err = st.startupOf("tiny")
	if err != nil || !g.IsZero() || len(g.Files) != 0 {
		t.Errorf("startupOf(tiny) = %+v, %v; want nothing", g, err)
	}
	in, err = st.inputs("tiny")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := in["files"]; ok {
		t.Errorf("inputs(tiny) = %v: has files", in)
	}
	if _, ok := in["startup"]; ok {
		t.Errorf("inputs(tiny) = %v: has startup", in)
	}
}
