package scheduler_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

func TestPlacementUnmarshal(t *testing.T) {
	tests := []struct {
		in   string // a request body
		want scheduler.Placement
	}{
		{`{}`, scheduler.Placement{}},
		{`{"placement": null}`, scheduler.Placement{}},
		{`{"placement": "auto"}`, scheduler.Placement{}},
		{`{"placement": "spread"}`, scheduler.Placement{Spread: true}},
		{`{"placement": {"host": "h1"}}`, scheduler.Placement{Host: "h1"}},
		{`{"placement": {"spread": true}}`, scheduler.Placement{Spread: true}},
		{`{"placement": {"spread": false}}`, scheduler.Placement{}},
		{`{"placement": {"host": "h1", "spread": false}}`, scheduler.Placement{Host: "h1"}},
		{`{"placement": { "host" : "h1" } }`, scheduler.Placement{Host: "h1"}},
	}
	for _, tt := range tests {
		var body struct {
			Placement scheduler.Placement `json:"placement"`
		}
		if err := json.Unmarshal([]byte(tt.in), &body); err != nil {
			t.Errorf("%s: got error %v", tt.in, err)
			continue
		}
		if body.Placement != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.in, body.Placement, tt.want)
		}
	}
}

func TestPlacementUnmarshalErrors(t *testing.T) {
	tests := []struct {
		in, want string // the placement member; the error message
	}{
		{`"Spread"`, `placement "Spread" is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`""`, `placement "" is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`"h1"`, `placement "h1" is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`true`, `placement true is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`3`, `placement 3 is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`["h1"]`, `placement ["h1"] is not one of "auto", "spread" or {"host": "HOST_ID"}`},
		{`{}`, `placement {} names no host: want "auto", "spread" or {"host": "HOST_ID"}`},
		{`{"host": ""}`, `placement host must be a host's id (a non-empty string), not ""`},
		{`{"host": null}`, `placement host must be a host's id (a non-empty string), not null`},
		{`{"host": 7}`, `placement host must be a host's id (a non-empty string), not 7`},
		{`{"spread": "yes"}`, `placement spread must be true or false, not "yes"`},
		{`{"spread": null}`, `placement spread must be true or false, not null`},
		{`{"hosts": ["a"]}`, `placement has an unknown member "hosts": want "auto", "spread" or {"host": "HOST_ID"}`},
		{`{"host": "a", "spread": true}`, `placement names host "a" and asks to spread: choose one`},
	}
	for _, tt := range tests {
		var body struct {
			Placement scheduler.Placement `json:"placement"`
		}
		err := json.Unmarshal([]byte(`{"placement": `+tt.in+`}`), &body)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: got error %v, want %s", tt.in, err, tt.want)
		}
	}
}

func TestPlacementMarshal(t *testing.T) {
	tests := []struct {
		in   scheduler.Placement
		want string
	}{
		{scheduler.Placement{}, `"auto"`},
		{scheduler.Placement{Spread: true}, `"spread"`},
		{scheduler.Placement{Host: "h1"}, `{"host":"h1"}`},
		{scheduler.Placement{Host: `a"b`}, `{"host":"a\"b"}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.in)
		if err != nil || string(b) != tt.want {
			t.Errorf("%+v: got %s, %v; want %s", tt.in, b, err, tt.want)
		}
		var back scheduler.Placement
		if err := json.Unmarshal(b, &back); err != nil || back != tt.in {
			t.Errorf("%s: read back %+v, %v; want %+v", b, back, err, tt.in)
		}
	}
	if _, err := json.Marshal(scheduler.Placement{Host: "h1", Spread: true}); err == nil || !strings.Contains(err.Error(), "choose one") {
		t.Errorf("host and spread: got %v, want an error", err)
	}
}

// FuzzPlacementJSON: any JSON a client sends decodes to a Placement or to
// an error; what decodes writes back in a form that reads back the same.
func FuzzPlacementJSON(f *testing.F) {
	for _, s := range []string{`null`, `"auto"`, `"spread"`, `{"host":"h1"}`, `{"spread":true}`, `{"host":"a","spread":false}`, `{}`, `[]`, `{"host":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var body struct {
			Placement scheduler.Placement `json:"placement"`
		}
		if err := json.Unmarshal([]byte(`{"placement":`+s+`}`), &body); err != nil {
			return
		}
		p := body.Placement
		if p.Host != "" && p.Spread {
			t.Fatalf("%s decoded to %+v: host and spread", s, p)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("%+v (from %s): marshal: %v", p, s, err)
		}
		var back scheduler.Placement
		if err := json.Unmarshal(b, &back); err != nil || back != p {
			t.Fatalf("%s (from %s) read back as %+v, %v; want %+v", b, s, back, err, p)
		}
	})
}
