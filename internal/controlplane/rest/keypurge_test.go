package rest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// Revoking a key cancels its builds, queued and running, and says why;
// a purge (of a revoked key only) deletes its templates and leaves
// another key's, and a second purge finds nothing (issue 31, finding 12).
func TestRevokeAndPurgeKeyBuilds(t *testing.T) {
	b := newBuildServer(t)
	ctx := context.Background()
	_, other, err := rest.NewKey(ctx, b.cat, "other", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	build := func(key, name, src string) string {
		t.Helper()
		resp, out := b.do(t, key, "POST", "/v1/templates", `{"name":"`+name+`","from_image":"`+src+`"}`)
		if resp.StatusCode != 202 {
			t.Fatalf("build %s: %d %v", name, resp.StatusCode, out)
		}
		return out["build_id"].(string)
	}
	b.waitBuild(t, build(b.user, "kept", "r.example/app:1"))
	b.waitBuild(t, build(other, "theirs", "r.example/app:1"))
	running := build(b.user, "slow", "r.example/hang:1")
	queued := build(b.user, "slow", "r.example/hang:2") // behind the first of its name

	if resp, out := b.do(t, b.admin, "POST", "/v1/keys/"+b.userID+"/purge", ""); resp.StatusCode != 409 {
		t.Errorf("purge of a key not revoked: %d %v, want 409", resp.StatusCode, out)
	}
	if resp, _ := b.do(t, b.admin, "DELETE", "/v1/keys/"+b.userID, ""); resp.StatusCode != 204 {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	for _, id := range []string{running, queued} {
		final := endedBuild(t, b, id)
		if final["status"] != "failed" || final["code"] != "canceled" || final["error"] != "the build was canceled: its API key was revoked" {
			t.Errorf("build %s of the revoked key: %v, want failed, canceled, its key revoked", id, final)
		}
	}
	if resp, _ := b.do(t, b.user, "GET", "/v1/templates", ""); resp.StatusCode != 401 {
		t.Errorf("the revoked key's request: %d, want 401", resp.StatusCode)
	}

	resp, out := b.do(t, b.admin, "POST", "/v1/keys/"+b.userID+"/purge", "")
	if resp.StatusCode != 200 || out["templates_deleted"] == nil || len(out["templates_deleted"].([]any)) != 1 ||
		out["templates_deleted"].([]any)[0] != "kept" || len(out["failed"].([]any)) != 0 {
		t.Errorf("purge: %d %v, want 200 with template kept deleted", resp.StatusCode, out)
	}
	if _, err := b.store.UserRootFS("kept"); err == nil {
		t.Error("the revoked key's template is still in the store")
	}
	if _, err := b.store.UserRootFS("theirs"); err != nil {
		t.Errorf("another key's template after the purge: %v", err)
	}
	resp, out = b.do(t, b.admin, "POST", "/v1/keys/"+b.userID+"/purge", "")
	if resp.StatusCode != 200 || len(out["templates_deleted"].([]any)) != 0 || out["builds_canceled"] != float64(0) || out["snapshots_deleted"] != float64(0) {
		t.Errorf("a second purge: %d %v, want 200 and nothing left to do", resp.StatusCode, out)
	}
	if resp, _ := b.do(t, b.user, "POST", "/v1/keys/"+b.userID+"/purge", ""); resp.StatusCode != 401 {
		t.Errorf("purge by the revoked key itself: %d, want 401", resp.StatusCode)
	}
	if resp, _ := b.do(t, b.admin, "POST", "/v1/keys/keynosuchkey/purge", ""); resp.StatusCode != 404 {
		t.Errorf("purge of an unknown key: %d, want 404", resp.StatusCode)
	}
}

// endedBuild polls build id's status (as an admin) until it has ended,
// at most 30 s, and returns it.
func endedBuild(t *testing.T, b *buildServer, id string) map[string]any {
	t.Helper()
	var st map[string]any
	testkit.WaitForf(t, 30*time.Second, func() string { return fmt.Sprintf("build %s ended (it is %v)", id, st["status"]) }, func() bool {
		_, st = b.do(t, b.admin, "GET", "/v1/templates/builds/"+id, "")
		return st["status"] == "succeeded" || st["status"] == "failed"
	})
	return st
}
