package hostagent

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestBakeNIC: bakes are isolated unless both Network and BakeNetwork are
// set; then a bake's NIC is a TAP in a namespace of the Manager (in a
// test-made host namespace), removed by release.
func TestBakeNIC(t *testing.T) {
	testkit.Root(t) // network namespaces
	env := nettest.NewEnv(t)
	prefix := "b" + strings.TrimPrefix(env.Prefix, "nt")
	m, err := network.New(network.Config{Prefix: prefix, HostNetNS: env.Host.Path, PoolSize: -1,
		Upstreams: []string{nettest.DNSAddr.String()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	p := netpolicy.Default()
	for _, tc := range []struct {
		cfg      Config
		isolated bool
	}{
		{Config{}, true},
		{Config{Network: m}, true},
		{Config{BakeNetwork: &p}, true},
		{Config{Network: m, BakeNetwork: &p}, false},
	} {
		a := &Agent{cfg: tc.cfg, log: slog.New(slog.DiscardHandler)}
		hook := a.bakeNIC()
		if got := hook == nil; got != tc.isolated {
			t.Errorf("network %v, bake network %v: isolated %v, want %v", tc.cfg.Network != nil, tc.cfg.BakeNetwork != nil, got, tc.isolated)
		}
	}
	a := &Agent{cfg: Config{Network: m, BakeNetwork: &p}, log: slog.New(slog.DiscardHandler)}
	nic, release, err := a.bakeNIC()(context.Background(), "bake test")
	if err != nil {
		t.Fatal(err)
	}
	if nic.MAC != guestnet.GuestMAC || nic.TAP == nil {
		t.Fatalf("bake NIC: MAC %q, TAP %v", nic.MAC, nic.TAP)
	}
	ours := func() []string {
		matches, _ := filepath.Glob(filepath.Join(network.NetnsDir, prefix+"-*"))
		return matches
	}
	if got := ours(); len(got) != 1 {
		t.Fatalf("namespaces of the Manager during the bake: %v, want one", got)
	}
	release()
	if got := ours(); len(got) != 0 {
		t.Errorf("namespaces left after release: %v", got)
	}
}
