package network

import (
	"errors"
	"net/netip"
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
		pfx, name, wild, reason := parseEntry(tc.in)
		switch {
		case tc.reason != "":
			if !strings.Contains(reason, tc.reason) {
				t.Errorf("parseEntry(%q): reason %q, want one containing %q", tc.in, reason, tc.reason)
			}
		case tc.pfx != "":
			if reason != "" || pfx.String() != tc.pfx {
				t.Errorf("parseEntry(%q) = %v (%q), want %s", tc.in, pfx, reason, tc.pfx)
			}
		default:
			if reason != "" || name != tc.name || wild != tc.wild {
				t.Errorf("parseEntry(%q) = %q wild %v (%q), want %q wild %v", tc.in, name, wild, reason, tc.name, tc.wild)
			}
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy([]byte(`{}`))
	if err != nil || !p.Internet {
		t.Fatalf("ParsePolicy({}) = %+v, %v; want internet on", p, err)
	}
	p, err = ParsePolicy([]byte(`{"internet": false, "allow_out": ["pypi.org", "*.pythonhosted.org", "1.1.1.1"]}`))
	if err != nil || p.Internet || len(p.AllowOut) != 3 {
		t.Fatalf("ParsePolicy = %+v, %v", p, err)
	}
	// Stored and shown in canonical form.
	p, err = ParsePolicy([]byte(`{"allow_out": [" PyPI.org. ", "*.Example.COM", "10.1.2.3/8", "1.2.3.4"], "deny_out": ["::ffff:5.6.7.8"]}`))
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
		_, err := ParsePolicy([]byte(tc.in))
		var pe *PolicyError
		if !errors.Is(err, ErrInvalidPolicy) || !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParsePolicy(%s): %v, want a PolicyError containing %q", tc.in, err, tc.want)
		}
	}
	many := Policy{AllowOut: make([]string, MaxPolicyEntries+1)}
	for i := range many.AllowOut {
		many.AllowOut[i] = "a.com"
	}
	if err := many.Validate(); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("%d entries: %v, want ErrInvalidPolicy", len(many.AllowOut), err)
	}
}

func TestResolvePrecedence(t *testing.T) {
	tests := []struct {
		p    Policy
		name string
		want nameVerdict
	}{
		{Policy{Internet: true}, "example.com", nameOpen},
		{Policy{}, "example.com", nameDenied},
		{Policy{AllowOut: []string{"example.com"}}, "example.com", nameAllowListed},
		{Policy{AllowOut: []string{"example.com"}}, "www.example.com", nameDenied},
		{Policy{AllowOut: []string{"*.example.com"}}, "a.b.example.com", nameAllowListed},
		{Policy{AllowOut: []string{"*.example.com"}}, "example.com", nameDenied},
		{Policy{AllowOut: []string{"*.example.com"}}, "badexample.com", nameDenied},
		{Policy{Internet: true, DenyOut: []string{"*.example.com"}}, "x.example.com", nameDenied},
		{Policy{Internet: true, DenyOut: []string{"*.example.com"}}, "example.org", nameOpen},
		{Policy{Internet: true, DenyOut: []string{"*.example.com"}, AllowOut: []string{"api.example.com"}}, "api.example.com", nameAllowListed},
		{Policy{DenyOut: []string{"api.example.com"}, AllowOut: []string{"*.example.com"}}, "api.example.com", nameAllowListed},
		{Policy{Internet: true, AllowOut: []string{"a.com"}}, "a.com", nameAllowListed},
	}
	for _, tc := range tests {
		c, err := tc.p.compile()
		if err != nil {
			t.Fatal(err)
		}
		if got := c.resolve(tc.name); got != tc.want {
			t.Errorf("%+v resolve(%s) = %v, want %v", tc.p, tc.name, got, tc.want)
		}
	}
}

func TestIntervalElements(t *testing.T) {
	type iv struct {
		key string
		end bool
	}
	tests := []struct {
		in   []string
		want []iv
	}{
		{nil, nil},
		{[]string{"10.0.0.0/8"}, []iv{{"10.0.0.0", false}, {"11.0.0.0", true}}},
		{[]string{"10.1.0.0/16", "10.0.0.0/8", "10.2.3.4/32"}, []iv{{"10.0.0.0", false}, {"11.0.0.0", true}}},
		{[]string{"10.0.0.0/24", "10.0.1.0/24", "10.0.3.0/24"},
			[]iv{{"10.0.0.0", false}, {"10.0.2.0", true}, {"10.0.3.0", false}, {"10.0.4.0", true}}},
		{[]string{"224.0.0.0/3"}, []iv{{"224.0.0.0", false}}},
		{[]string{"0.0.0.0/0", "1.2.3.4/32"}, []iv{{"0.0.0.0", false}}},
	}
	for _, tc := range tests {
		var ps []netip.Prefix
		for _, s := range tc.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []iv
		for _, e := range intervalElements(ps) {
			got = append(got, iv{netip.AddrFrom4([4]byte(e.Key)).String(), e.IntervalEnd})
		}
		if len(got) != len(tc.want) {
			t.Errorf("intervalElements(%v) = %v, want %v", tc.in, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("intervalElements(%v) = %v, want %v", tc.in, got, tc.want)
				break
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("zero config: %v", err)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Prefix: "Panda"}, "prefix"},
		{Config{Prefix: "waytoolong"}, "prefix"},
		{Config{Pool: netip.MustParsePrefix("10.0.0.0/30")}, "pool"},
		{Config{Pool: netip.MustParsePrefix("10.0.0.1/16")}, "host bits"},
		{Config{Pool: netip.MustParsePrefix("100.96.0.0/16")}, "overlaps the guest"},
		{Config{Upstreams: []string{"dns.google"}}, "upstream"},
		{Config{DNSMaxAnswer: 100}, "dns limits"},
	} {
		if err := tc.c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error about %s", tc.c, err, tc.want)
		}
	}
}

func TestSubnetAddressing(t *testing.T) {
	m := &Manager{cfg: Config{Pool: netip.MustParsePrefix("10.234.0.0/16")}}
	for _, tc := range []struct {
		idx        int
		host, nsid string
	}{{0, "10.234.0.1", "10.234.0.2"}, {1, "10.234.0.5", "10.234.0.6"}, {16383, "10.234.255.253", "10.234.255.254"}} {
		h, n := m.subnetAddr(tc.idx, 1), m.subnetAddr(tc.idx, 2)
		if h.String() != tc.host || n.String() != tc.nsid || m.indexOf(n) != tc.idx {
			t.Errorf("subnet %d: %s %s (index back %d)", tc.idx, h, n, m.indexOf(n))
		}
	}
	if m.indexOf(netip.MustParseAddr("10.234.0.1")) != -1 || m.indexOf(netip.MustParseAddr("10.235.0.2")) != -1 {
		t.Error("indexOf accepts a host-side or foreign address")
	}
}
