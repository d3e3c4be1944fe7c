package pandastack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

func TestPlacementJSON(t *testing.T) {
	tests := []struct {
		in   Placement
		want string
	}{
		{Placement{}, `"auto"`},
		{Spread(), `"spread"`},
		{OnHost("h1"), `{"host":"h1"}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.in)
		if err != nil || string(b) != tt.want {
			t.Errorf("%+v: got %s, %v; want %s", tt.in, b, err, tt.want)
			continue
		}
		var back Placement
		if err := json.Unmarshal(b, &back); err != nil || back != tt.in {
			t.Errorf("%s: read back %+v, %v; want %+v", b, back, err, tt.in)
		}
		// The server reads it as the same placement.
		var srv scheduler.Placement
		if err := json.Unmarshal(b, &srv); err != nil || srv.Host != tt.in.Host || srv.Spread != tt.in.Spread {
			t.Errorf("%s: the server reads %+v, %v; want %+v", b, srv, err, tt.in)
		}
	}
	if _, err := json.Marshal(Placement{Host: "h1", Spread: true}); err == nil {
		t.Errorf("host and spread: got no error")
	}
	for _, in := range []string{`null`, `{"spread":true}`} {
		var p Placement
		if err := json.Unmarshal([]byte(in), &p); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
	for _, in := range []string{`"Spread"`, `""`, `3`, `{"host":"a","spread":true}`} {
		var p Placement
		if err := json.Unmarshal([]byte(in), &p); err == nil {
			t.Errorf("%s: got %+v, want an error", in, p)
		}
	}
}

// TestPlacementRequests: create and fork send the placement asked for, and
// nothing without one.
func TestPlacementRequests(t *testing.T) {
	var bodies []string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, r.URL.Path+" "+canonJSON(string(b)))
		if r.URL.Path == "/v1/sandboxes" {
			writeJSON(w, 200, map[string]any{"id": "abc", "state": "running", "host_id": "h2"})
			return
		}
		writeJSON(w, 200, map[string]any{"children": []any{
			map[string]any{"sandbox": map[string]any{"id": "c1", "state": "running", "host_id": "h2"}},
		}})
	})
	ctx := context.Background()
	sb, err := c.Create(ctx, CreateOptions{Template: "tiny", Placement: OnHost("h2")})
	if err != nil || sb.Info.HostID != "h2" {
		t.Fatalf("got %+v, %v", sb, err)
	}
	if _, err := c.Create(ctx, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ForkWithOptions(ctx, ForkOptions{Placement: Spread()}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ForkWithOptions(ctx, ForkOptions{Count: 1, Placement: OnHost("h3")}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Fork(ctx, 1); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`/v1/sandboxes {"template":"tiny","placement":{"host":"h2"}}`,
		`/v1/sandboxes {}`,
		`/v1/sandboxes/abc/fork {"count":1,"placement":"spread"}`,
		`/v1/sandboxes/abc/fork {"count":1,"placement":{"host":"h3"}}`,
		`/v1/sandboxes/abc/fork {"count":1}`,
	}
	if len(bodies) != len(want) {
		t.Fatalf("got requests %q, want %q", bodies, want)
	}
	for i := range want {
		path, body, _ := strings.Cut(want[i], " ")
		if bodies[i] != path+" "+canonJSON(body) {
			t.Errorf("request %d: got %s, want %s", i, bodies[i], want[i])
		}
	}

	// Checked before anything is sent.
	bad := Placement{Host: "h1", Spread: true}
	if _, err := c.Create(ctx, CreateOptions{Placement: bad}); !errors.Is(err, ErrInvalid) {
		t.Errorf("create: got %v, want ErrInvalid", err)
	}
	if _, err := sb.ForkWithOptions(ctx, ForkOptions{Placement: bad}); !errors.Is(err, ErrInvalid) {
		t.Errorf("fork: got %v, want ErrInvalid", err)
	}
	if _, err := sb.ForkWithOptions(ctx, ForkOptions{Count: -1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("fork -1: got %v, want ErrInvalid", err)
	}
	if len(bodies) != len(want) {
		t.Errorf("invalid placements were sent: %q", bodies[len(want):])
	}
}
