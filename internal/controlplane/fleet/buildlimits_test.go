package fleet_test

import (
	"errors"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
)

// A fleet checks a key's builds in progress and a template's versions
// against the catalog (issue 31, finding 11), and Cancel reaches the
// build's host: the build fails canceled and records no version.
func TestTemplatesLimitsAndCancel(t *testing.T) {
	r, _, _, _ := newRegistry(t)
	ctx := t.Context()
	h := newBuildHost(t)
	ids, builderOf := fixed(map[string]builds.Builder{"h1": h.m})
	ts := fleet.NewTemplates(r, "h1")
	fleet.SetBuilders(ts, ids, builderOf, func(string) bool { return false })
	t.Cleanup(ts.Close)
	start := func(name, image, owner string) (builds.Status, error) {
		return ts.Start(ctx, builds.Spec{Name: name, FromImage: image, Owner: owner, MaxBuilds: 2, MaxVersions: 2})
	}
	follow := func(id string) builds.Status {
		t.Helper()
		st, err := ts.Follow(ctx, id, func(string) {})
		if err != nil {
			t.Fatalf("Follow %s: %v", id, err)
		}
		return st
	}

	a, err := start("a", "slow:1", "key_a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := start("b", "slow:1", "key_a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := start("c", "alpine:1", "key_a"); !errors.Is(err, builds.ErrBusy) {
		t.Errorf("key_a's third build at once = %v, want ErrBusy", err)
	}
	d, err := start("d", "alpine:1", "key_b") // another key: queued for a slot
	if err != nil {
		t.Fatalf("key_b's build meanwhile: %v", err)
	}
	if _, err := ts.Cancel(ctx, a.ID, "its key was revoked"); err != nil {
		t.Fatalf("Cancel: %v", err)
	}
	if st := follow(a.ID); st.State != builds.StateFailed || st.Code != builds.CodeCanceled || st.Error != "its key was revoked" {
		t.Errorf("canceled build: %+v", st)
	}
	if st := follow(d.ID); st.State != builds.StateSucceeded {
		t.Errorf("key_b's build, once a slot was free: %+v", st)
	}
	release(h)
	if st := follow(b.ID); st.State != builds.StateSucceeded {
		t.Fatalf("build b: %+v", st)
	}
	if _, err := ts.UserTemplate(ctx, "a"); err == nil {
		t.Error("the canceled first build of a left a template")
	}
	// b has one version; a second is the last one MaxVersions allows.
	st, err := start("b", "alpine:2", "key_a")
	if err != nil || follow(st.ID).State != builds.StateSucceeded {
		t.Fatalf("b's second version: %v", err)
	}
	if _, err := start("b", "alpine:3", "key_a"); !errors.Is(err, builds.ErrLimit) {
		t.Errorf("b's third version = %v, want ErrLimit", err)
	}
}
