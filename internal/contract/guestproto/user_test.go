package guestproto_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

func TestValidateUser(t *testing.T) {
	valid := []string{"", "root", "0", "1000", "1000:1000", "app:staff", "www-data", "a.b_c-d", "host$", "4294967294", "0:0", "app:100"}
	for _, u := range valid {
		if err := guestproto.ValidateUser(u); err != nil {
			t.Errorf("ValidateUser(%q) = %v, want nil", u, err)
		}
	}
	invalid := []string{":", "a:", ":b", "a:b:c", "a b", "-x", "x:-y", "4294967295", "99999999999", "a/b", "a\x00", "é", "$x", "a$b", strings.Repeat("a", guestproto.MaxUserLen+1)}
	for _, u := range invalid {
		if err := guestproto.ValidateUser(u); err == nil {
			t.Errorf("ValidateUser(%q) = nil, want an error", u)
		}
		r := guestproto.ExecRequest{Argv: []string{"true"}, User: u}
		if err := r.Validate(); err == nil {
			t.Errorf("ExecRequest with user %q is valid", u)
		}
	}
}

// TestExecRequestUserWire: the field is "user" and omitted when empty, so
// a request without one is what old agents always received.
func TestExecRequestUserWire(t *testing.T) {
	b, _ := json.Marshal(guestproto.ExecRequest{Argv: []string{"id"}})
	if got, want := string(b), `{"argv":["id"]}`; got != want {
		t.Errorf("without a user: got %s, want %s", got, want)
	}
	b, _ = json.Marshal(guestproto.ExecRequest{Argv: []string{"id"}, User: "1000:1000"})
	if got, want := string(b), `{"argv":["id"],"user":"1000:1000"}`; got != want {
		t.Errorf("with a user: got %s, want %s", got, want)
	}
}
