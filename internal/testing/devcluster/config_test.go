package devcluster

import (
	"net/netip"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c, err := Config{Binary: "/bin/panda"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	if c.Agents != 3 || c.Listen != d.Listen || c.Store != StoreS3 || c.Name != "pdev" || c.Subnet != d.Subnet || c.Images != d.Images {
		t.Errorf("defaults: got %+v", c)
	}
	if got, want := c.bridgeAddr(), netip.MustParseAddr("10.239.0.1"); got != want {
		t.Errorf("bridge address: got %s, want %s", got, want)
	}
	if got, want := c.agentAddr(3), netip.MustParseAddr("10.239.0.13"); got != want {
		t.Errorf("agent-3's address: got %s, want %s", got, want)
	}
	if got := c.netnsName(2) + " " + c.bridgeName() + " " + c.peerName(2); got != "pdev-a2 pdev-br pdev-p2" {
		t.Errorf("names: got %s", got)
	}
}

func TestConfigInvalid(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Binary: "p", Agents: 51}, "agents 51"},
		{Config{Binary: "p", Agents: -1}, "agents -1"},
		{Config{Binary: "p", Name: "toolong"}, `name "toolong"`},
		{Config{Binary: "p", Name: "1ab"}, `name "1ab"`},
		{Config{Binary: "p", Name: "a-b"}, `name "a-b"`},
		{Config{Binary: "p", Subnet: netip.MustParsePrefix("10.0.0.0/25")}, "subnet 10.0.0.0/25"},
		{Config{Binary: "p", Subnet: netip.MustParsePrefix("fd00::/64")}, "subnet fd00::/64"},
		{Config{Binary: "p", Store: "minio"}, `store "minio"`},
		{Config{Binary: "p", Listen: "7788"}, `listen "7788"`},
	} {
		_, err := tc.cfg.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}

func TestIsOurs(t *testing.T) {
	for n, want := range map[string]bool{
		"pdev-br": true, "pdev-a1": true, "pdev-p12": true,
		"pdev-a": false, "pdev-x1": false, "pdev-a1b": false, "pdevx-a1": false, "pdev": false, "panda3": false, "pdev-br0": false,
	} {
		if got := isOurs("pdev", n); got != want {
			t.Errorf("isOurs(pdev, %s) = %v, want %v", n, got, want)
		}
	}
}
