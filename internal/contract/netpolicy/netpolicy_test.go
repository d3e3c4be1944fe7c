package netpolicy

import (
	"errors"
	"strings"
	"testing"
)

func TestParseEntry(t *testing.T) {
	tests := []struct {
		in     string
		pfx    string // want an address range
		name   string // or a name
		wild   bool
		reason string // or an error containing this
	}{
		{in: "203.0.113.7", pfx: "203.0.113.7/32"},
		{in: " 203.0.113.0/24 ", pfx: "203.0.113.0/24"},
		{in: "203.0.113.9/24", pfx: "203.0.113.0/24"},
		{in: "0.0.0.0/0", pfx: "0.0.0.0/0"},
		{in: "::ffff:203.0.113.7", pfx: "203.0.113.7/32"},
		{in: "Example.COM.", name: "example.com"},
		{in: "*.example.com", name: "example.com", wild: true},
		{in: "localhost", name: "localhost"},
		{in: "_dmarc.example.com", name: "_dmarc.example.com"},
		{in: "2001:db8::1", reason: "only IPv4"},
		{in: "2001:db8::/32", reason: "only IPv4"},
		{in: "10.0.0.0/33", reason: "not a valid CIDR"},
		{in: "1.2.3", reason: "not a valid address"},
		{in: "999.1.1.1", reason: "not a valid address"},
		{in: "", reason: "empty"},
		{in: "*", reason: "not a valid domain"},
		{in: "*.*.example.com", reason: "not a valid domain"},
		{in: "a..b", reason: "label"},
		{in: "-a.com", reason: "'-'"},
		{in: "exa mple.com", reason: "character"},
		{in: "http://example.com", reason: "not a valid"},
		{in: strings.Repeat("a", 64) + ".com", reason: "label"},
	}
	for _, tc := range tests {
		en, reason := ParseEntry(tc.in)
		pfx, name, wild := en.Prefix, en.Name, en.Wild
		switch {
		case tc.reason != "":
			if !strings.Contains(reason, tc.reason) {
				t.Errorf("ParseEntry(%q): reason %q, want one containing %q", tc.in, reason, tc.reason)
			}
		case tc.pfx != "":
			if reason != "" || pfx.String() != tc.pfx {
				t.Errorf("ParseEntry(%q) = %v (%q), want %s", tc.in, pfx, reason, tc.pfx)
			}
		default:
			if reason != "" || name != tc.name || wild != tc.wild {
				t.Errorf("ParseEntry(%q) = %q wild %v (%q), want %q wild %v", tc.in, name, wild, reason, tc.name, tc.wild)
			}
		}
	}
}

func TestParse(t *testing.T) {
	p, err := Parse([]byte(`{}`))
	if err != nil || !p.Internet {
		t.Fatalf("Parse({}) = %+v, %v; want internet on", p, err)
	}
	p, err = Parse([]byte(`{"internet": false, "allow_out": ["pypi.org", "*.pythonhosted.org", "1.1.1.1"]}`))
	if err != nil || p.Internet || len(p.AllowOut) != 3 {
		t.Fatalf("ParsePolicy = %+v, %v", p, err)
	}
	// Stored and shown in canonical form.
	p, err = Parse([]byte(`{"allow_out": [" PyPI.org. ", "*.Example.COM", "10.1.2.3/8", "1.2.3.4"], "deny_out": ["::ffff:5.6.7.8"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(p.AllowOut, ","), "pypi.org,*.example.com,10.0.0.0/8,1.2.3.4"; got != want {
		t.Errorf("allow_out stored as %s, want %s", got, want)
	}
	if got, want := strings.Join(p.DenyOut, ","), "5.6.7.8"; got != want {
		t.Errorf("deny_out stored as %s, want %s", got, want)
	}
	for _, tc := range []struct{ in, want string }{
		{`{"internet": true, "deny_out": ["ok.com", "bad..com"]}`, `deny_out entry "bad..com"`},
		{`{"allow_out": ["fe80::/10"]}`, `allow_out entry "fe80::/10": only IPv4`},
		{`{"internets": true}`, `unknown field`},
		{`[]`, `not a valid policy`},
	} {
		_, err := Parse([]byte(tc.in))
		var pe *Error
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s): %v, want a Error containing %q", tc.in, err, tc.want)
		}
	}
	many := Policy{AllowOut: make([]string, MaxEntries+1)}
	for i := range many.AllowOut {
		many.AllowOut[i] = "a.com"
	}
	if err := many.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d entries: %v, want ErrInvalid", len(many.AllowOut), err)
	}
}
