package rest

import (
	"net/http"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/errs"
	"github.com/pandastack/pandastack/internal/controlplane"
)

// Every kind has its status, and the kinds that are the server's, a host's
// or a guest's failures are the 5xx ones.
func TestStatuses(t *testing.T) {
	for k, st := range statuses {
		if got, want := k.ServerSide(), st >= 500; got != want {
			t.Errorf("%s: status %d, ServerSide %v, want %v", k, st, got, want)
		}
	}
	for _, c := range errs.All {
		if _, ok := statuses[c]; !ok {
			t.Errorf("%s: no status", c)
		}
	}
	if got := statusOf("no_such_kind"); got != http.StatusInternalServerError {
		t.Errorf("status of an unknown kind: got %d, want 500", got)
	}
	if got := classify(&http.MaxBytesError{Limit: 10}); got.Status != http.StatusRequestEntityTooLarge || got.Code != "payload_too_large" {
		t.Errorf("classify(MaxBytesError) = %+v, want 413 payload_too_large", got)
	}
	if got := classify(controlplane.Errorf(controlplane.Corrupt, "x")); got.Status != http.StatusConflict || got.Code != "corrupt" || got.Message != "x" {
		t.Errorf("classify(corrupt) = %+v, want 409 corrupt x", got)
	}
}
