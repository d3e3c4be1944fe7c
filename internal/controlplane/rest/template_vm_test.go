package rest_test

// User template versions and owners with real guests: the "images" are
// the tiny root filesystem with /panda-version holding the image's name.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// tinyWithVersionFile is a tmplbuild.Convert: src's root filesystem is the
// tiny one with src written to /panda-version.
func tinyWithVersionFile(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
	progress("copying the tiny root filesystem")
	cp := exec.CommandContext(ctx, "cp", "--reflink=auto", "--sparse=always", filepath.Join(testkit.Images(), "rootfs-tiny.ext4"), out)
	if b, err := cp.CombinedOutput(); err != nil {
		return builds.Result{}, fmt.Errorf("cp: %v: %s", err, b)
	}
	f := out + ".version"
	defer os.Remove(f)
	if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
		return builds.Result{}, err
	}
	dbg := exec.CommandContext(ctx, "debugfs", "-w", "-R", "write "+f+" /panda-version", out)
	if b, err := dbg.CombinedOutput(); err != nil {
		return builds.Result{}, fmt.Errorf("debugfs: %v: %s", err, b)
	}
	return builds.Result{Digest: "sha256:" + src}, nil
}

func buildTemplate(t *testing.T, key, name, src string) map[string]any {
	t.Helper()
	r := do(t, key, "POST", "/v1/templates", map[string]any{"name": name, "from_image": src})
	expect(t, r, 202, "")
	var st struct {
		BuildID string `json:"build_id"`
	}
	r.json(t, &st)
	var final map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(do(t, key, "GET", "/v1/templates/builds/"+st.BuildID+"/logs", nil).body)), "\n") {
		json.Unmarshal([]byte(line), &final)
	}
	if final["status"] != "succeeded" {
		t.Fatalf("build of %s from %s: %v", name, src, final)
	}
	return final
}

// TestTemplateVersionsVM: a rebuild makes version 2 while a sandbox of
// version 1 keeps running it; NAME:1 still creates version 1; another
// key cannot use the template until an admin publishes it; deleting is
// refused while sandboxes of it live.
func TestTemplateVersionsVM(t *testing.T) {
	world(t)
	if os.Getenv("PANDA_TEST_HOST") == "remote" {
		t.Skip("template builds run beside a local host only")
	}
	owner, other := newKey(t, "tmpl-owner", nil), newKey(t, "tmpl-other", nil)
	t.Cleanup(func() { do(t, e.admin, "DELETE", "/v1/templates/vt?force=true", nil) })
	cat := func(id string) string {
		t.Helper()
		x := run(t, owner, id, map[string]any{"argv": []string{"cat", "/panda-version"}})
		return x.Stdout
	}
	if v := buildTemplate(t, owner, "vt", "vm/one")["version"]; v != float64(1) {
		t.Fatalf("first build made version %v", v)
	}
	sb1 := create(t, owner, map[string]any{"template": "vt"})
	if sb1.Template != "vt:1" || cat(sb1.ID) != "vm/one" {
		t.Fatalf("sandbox of vt: template %q, /panda-version %q", sb1.Template, cat(sb1.ID))
	}
	if v := buildTemplate(t, owner, "vt", "vm/two")["version"]; v != float64(2) {
		t.Fatalf("rebuild made version %v", v)
	}
	if got := cat(sb1.ID); got != "vm/one" {
		t.Errorf("the earlier sandbox reads %q after the rebuild, want vm/one", got)
	}
	sb2 := create(t, owner, map[string]any{"template": "vt"})
	if sb2.Template != "vt:2" || cat(sb2.ID) != "vm/two" {
		t.Errorf("sandbox of vt after the rebuild: template %q, /panda-version %q", sb2.Template, cat(sb2.ID))
	}
	pinned := create(t, owner, map[string]any{"template": "vt:1"})
	if pinned.Template != "vt:1" || cat(pinned.ID) != "vm/one" {
		t.Errorf("sandbox of vt:1: template %q, /panda-version %q", pinned.Template, cat(pinned.ID))
	}

	// Private to its owner until published.
	expect(t, do(t, other, "POST", "/v1/sandboxes", map[string]any{"template": "vt"}), 404, "not_found")
	expect(t, do(t, other, "POST", "/v1/templates", map[string]any{"name": "vt", "from_image": "vm/three"}), 409, "conflict")
	expect(t, do(t, e.admin, "POST", "/v1/templates/vt/publish", nil), 200, "")
	sbOther := create(t, other, map[string]any{"template": "vt"})
	if sbOther.Template != "vt:2" {
		t.Errorf("another key's sandbox after publish: template %q", sbOther.Template)
	}

	// Delete: refused while they live.
	expect(t, do(t, owner, "DELETE", "/v1/templates/vt", nil), 409, "conflict")
	expect(t, do(t, owner, "DELETE", "/v1/templates/vt:1", nil), 409, "conflict")
}
