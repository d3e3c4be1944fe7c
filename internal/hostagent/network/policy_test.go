package network

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
)

func TestResolvePrecedence(t *testing.T) {
	tests := []struct {
		p    netpolicy.Policy
		name string
		want nameVerdict
	}{
		{netpolicy.Policy{Internet: true}, "example.com", nameOpen},
		{netpolicy.Policy{}, "example.com", nameDenied},
		{netpolicy.Policy{AllowOut: []string{"example.com"}}, "example.com", nameAllowListed},
		{netpolicy.Policy{AllowOut: []string{"example.com"}}, "www.example.com", nameDenied},
		{netpolicy.Policy{AllowOut: []string{"*.example.com"}}, "a.b.example.com", nameAllowListed},
		{netpolicy.Policy{AllowOut: []string{"*.example.com"}}, "example.com", nameDenied},
		{netpolicy.Policy{AllowOut: []string{"*.example.com"}}, "badexample.com", nameDenied},
		{netpolicy.Policy{Internet: true, DenyOut: []string{"*.example.com"}}, "x.example.com", nameDenied},
		{netpolicy.Policy{Internet: true, DenyOut: []string{"*.example.com"}}, "example.org", nameOpen},
		{netpolicy.Policy{Internet: true, DenyOut: []string{"*.example.com"}, AllowOut: []string{"api.example.com"}}, "api.example.com", nameAllowListed},
		{netpolicy.Policy{DenyOut: []string{"api.example.com"}, AllowOut: []string{"*.example.com"}}, "api.example.com", nameAllowListed},
		{netpolicy.Policy{Internet: true, AllowOut: []string{"a.com"}}, "a.com", nameAllowListed},
	}
	for _, tc := range tests {
		c, err := compile(tc.p)
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
