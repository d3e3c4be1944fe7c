package guestnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TestGuestInitAgrees holds the constants to the values the guest's /init
// configures.
func TestGuestInitAgrees(t *testing.T) {
	b, err := os.ReadFile("../../../../scripts/guest-init.sh")
	if err != nil {
		t.Fatal(err)
	}
	init := string(b)
	for name, want := range map[string]string{
		"GUEST_IP": GuestIP, "PREFIX_LEN": fmt.Sprint(PrefixLen), "GATEWAY": GatewayIP,
		"GATEWAY_MAC": GatewayMAC, "DNS": DNS,
	} {
		m := regexp.MustCompile(`(?m)^` + name + `=(\S+)$`).FindStringSubmatch(init)
		if m == nil || m[1] != want {
			t.Errorf("guest-init.sh: %s = %q, want %q", name, m, want)
		}
	}
	if !strings.Contains(init, "dev "+GuestIf) {
		t.Errorf("guest-init.sh does not configure %s", GuestIf)
	}
	p := netip(t, GuestIP)
	g := netip(t, GatewayIP)
	_, n, _ := net.ParseCIDR(fmt.Sprintf("%s/%d", GuestIP, PrefixLen))
	if !n.Contains(g) || p.Equal(g) {
		t.Errorf("gateway %s is not another address of the guest's network %s", g, n)
	}
	for _, s := range []string{GuestMAC, GatewayMAC} {
		if mac, err := net.ParseMAC(s); err != nil || len(mac) != 6 || mac[0]&1 != 0 {
			t.Errorf("%s is not a unicast MAC address (%v)", s, err)
		}
	}
}

func netip(t *testing.T, s string) net.IP {
	ip := net.ParseIP(s)
	if ip == nil {
		t.Fatalf("%q is not an IP address", s)
	}
	return ip
}

// TestIsolated checks the namespace Isolated makes (one TAP, the gateway's
// address and MAC, no route out) and that nothing of it is left once its
// descriptors are closed.
func TestIsolated(t *testing.T) {
	testkit.Root(t) // network namespaces
	fdsBefore := testkit.OpenFDs(t)
	nic, release, err := IsolatedNIC(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if nic.MAC != GuestMAC {
		t.Errorf("MAC %q, want %q", nic.MAC, GuestMAC)
	}
	ifr, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(int(nic.TAP.Fd()), unix.TUNGETIFF, ifr); err != nil {
		t.Fatal(err)
	}
	if got := ifr.Uint16() & (unix.IFF_TUN | unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE); got != TAPFlags {
		t.Errorf("TAP flags %#x, want %#x", got, TAPFlags)
	}
	nsfd, err := unix.IoctlRetInt(int(nic.TAP.Fd()), unix.TUNGETDEVNETNS)
	if err != nil {
		t.Fatal(err)
	}
	ns := netns.NsHandle(nsfd)
	var st unix.Stat_t
	if err := unix.Fstat(nsfd, &st); err != nil {
		t.Fatal(err)
	}
	nsIno := st.Ino
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil || self.Ino == nsIno {
		t.Fatal("the TAP is in the test's own network namespace")
	}
	if got := linkNames(t, ns); !slices.Equal(got, []string{"lo", ifr.Name()}) {
		t.Errorf("namespace holds links %q, want lo and the TAP %s", got, ifr.Name())
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName(ifr.Name())
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().HardwareAddr.String() != GatewayMAC || link.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("TAP: MAC %s, flags %v; want %s, up", link.Attrs().HardwareAddr, link.Attrs().Flags, GatewayMAC)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%s/%d", GatewayIP, PrefixLen); len(addrs) != 1 || addrs[0].IPNet.String() != want {
		t.Errorf("TAP addresses %v, want only %s (no IPv6)", addrs, want)
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.String() != fmt.Sprintf("100.96.0.0/%d", PrefixLen) {
			t.Errorf("namespace has a route %v; want only the guest's network", r)
		}
	}
	h.Close()

	ns.Close()
	release()
	if refs := nsRefs(t, nsIno); len(refs) != 0 {
		t.Errorf("the namespace is still referred to by %q after its TAP was closed", refs)
	}
	if got := testkit.OpenFDs(t); got != fdsBefore {
		t.Errorf("the test has %d descriptors open, %d before", got, fdsBefore)
	}
}

// linkNames lists the links of namespace ns.
func linkNames(t *testing.T, ns netns.NsHandle) []string {
	t.Helper()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		out = append(out, l.Attrs().Name)
	}
	slices.Sort(out)
	return out
}

// nsRefs lists what in /proc refers to the network namespace with inode
// ino: a process in it, or a descriptor of it.
func nsRefs(t *testing.T, ino uint64) []string {
	t.Helper()
	want := fmt.Sprintf("net:[%d]", ino)
	var refs []string
	links, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, l := range append(links, fds...) {
		if dest, err := os.Readlink(l); err == nil && dest == want {
			refs = append(refs, l)
		}
	}
	return refs
}
