package cli

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// keys revoke --purge and keys purge: the requests, the summary, and a
// purge that left something is an error that says to run it again.
func TestKeysPurge(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		switch r.Method + " " + r.URL.Path {
		case "DELETE /v1/keys/keyone":
			w.WriteHeader(http.StatusNoContent)
		case "POST /v1/keys/keyone/purge":
			io.WriteString(w, `{"key_id":"keyone","builds_canceled":1,"sandboxes_stopped":0,"snapshots_deleted":2,"templates_deleted":["app","web"],"failed":[]}`)
		case "POST /v1/keys/keytwo/purge":
			io.WriteString(w, `{"key_id":"keytwo","builds_canceled":0,"sandboxes_stopped":0,"snapshots_deleted":0,"templates_deleted":[],`+
				`"failed":[{"what":"snapshot s1","error":{"code":"unavailable","message":"a host agent cannot be reached right now"}}]}`)
		default:
			http.NotFound(w, r)
		}
	})
	r := runCLI(context.Background(), "", "keys", "revoke", "--purge", "keyone", "--api-url", f.url, "--api-key", "k")
	if r.err != nil || !strings.Contains(r.stdout, "1 template builds canceled, 0 sandboxes stopped, 2 snapshots deleted, 2 templates deleted (app, web)") {
		t.Errorf("keys revoke --purge: %v, got\n%s", r.err, r.stdout)
	}
	if want := []string{"DELETE /v1/keys/keyone  Bearer k", "POST /v1/keys/keyone/purge  Bearer k"}; !slices.Equal(f.reqs, want) {
		t.Errorf("requests %q, want %q", f.reqs, want)
	}
	r = runCLI(context.Background(), "", "keys", "purge", "keytwo", "--api-url", f.url, "--api-key", "k")
	if r.err == nil || !strings.Contains(r.err.Error(), "snapshot s1: a host agent cannot be reached right now (run keys purge keytwo again") {
		t.Errorf("keys purge that left a snapshot: err %v, want it named", r.err)
	}
}
