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

// TestIsolatedRefusesBeyondGateway plays the guest on an isolated TAP: a
// datagram to an address beyond the gateway must be answered with ICMP
// "network unreachable" (so that a guest's connection fails at once, as a
// Dockerfile RUN step without network must), not dropped silently.
func TestIsolatedRefusesBeyondGateway(t *testing.T) {
	testkit.Root(t)
	nic, release, err := IsolatedNIC(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	// The guest's neighbour entry, so that the kernel answers without
	// asking for the guest's MAC first.
	nsfd, err := unix.IoctlRetInt(int(nic.TAP.Fd()), unix.TUNGETDEVNETNS)
	if err != nil {
		t.Fatal(err)
	}
	ns := netns.NsHandle(nsfd)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(isolatedTAP)
	if err != nil {
		t.Fatal(err)
	}
	guestMAC, _ := net.ParseMAC(GuestMAC)
	gwMAC, _ := net.ParseMAC(GatewayMAC)
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: netip(t, GuestIP), HardwareAddr: guestMAC}); err != nil {
		t.Fatal(err)
	}

	far := net.ParseIP("198.51.100.7").To4() // beyond the gateway
	udp := []byte{0x9c, 0x40, 0, 9, 0, 12, 0, 0, 'p', 'i', 'n', 'g'}
	ip := []byte{0x45, 0, 0, byte(20 + len(udp)), 0, 1, 0, 0, 64, unix.IPPROTO_UDP, 0, 0}
	ip = append(append(ip, netip(t, GuestIP).To4()...), far...)
	sum := ipChecksum(ip)
	ip[10], ip[11] = byte(sum>>8), byte(sum)
	frame := make([]byte, 10) // the virtio-net header (IFF_VNET_HDR), all zero
	frame = append(append(append(frame, gwMAC...), guestMAC...), 0x08, 0x00)
	frame = append(append(frame, ip...), udp...)
	if _, err := nic.TAP.Write(frame); err != nil {
		t.Fatal(err)
	}

	buf := make([]byte, 2048)
	for {
		// A bound on the wait, not a timing goal: without an answer the
		// kernel dropped the datagram, which is the failure.
		fds := []unix.PollFd{{Fd: int32(nic.TAP.Fd()), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 10_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatal("no answer to a datagram sent beyond the gateway: dropped silently, so the guest's connections there hang")
		}
		n, err = nic.TAP.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		f := buf[10:n]
		if len(f) < 14+20+8 || f[12] != 0x08 || f[13] != 0x00 || f[14+9] != unix.IPPROTO_ICMP {
			continue // not IPv4 ICMP (a frame of the kernel's own)
		}
		ipHdr := f[14:]
		icmp := ipHdr[int(ipHdr[0]&0x0f)*4:]
		if src, dst := net.IP(ipHdr[12:16]), net.IP(ipHdr[16:20]); !src.Equal(netip(t, GatewayIP)) || !dst.Equal(netip(t, GuestIP)) {
			t.Fatalf("ICMP from %s to %s, want from the gateway %s to the guest %s", src, dst, GatewayIP, GuestIP)
		}
		if icmp[0] != 3 || icmp[1] != 0 {
			t.Fatalf("ICMP type %d code %d, want 3 (destination unreachable) code 0 (network)", icmp[0], icmp[1])
		}
		return
	}
}

// ipChecksum is the Internet checksum of an IPv4 header.
func ipChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}
