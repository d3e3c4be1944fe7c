package devcluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// The cluster's network, all named after Config.Name (here "pdev"):
//
//	root namespace                           namespace pdev-a1 (agent-1)
//	  pdev-br  bridge, 10.239.0.1/24            eth0 10.239.0.11/24
//	    pdev-a1 ──────────── veth ──────────────┘
//	    pdev-a2 ──── … pdev-a2 (agent-2) eth0 10.239.0.12/24
//	  the control plane (through a forwarder
//	  on 10.239.0.1 when it listens on loopback),
//	  versitygw on 10.239.0.1:9000
//
// An agent's namespace has no default route: from it only the bridge's
// subnet is reachable — the control plane, the object store and the other
// agents — never the machine's uplink. The root namespace reaches the
// agents' host APIs over the bridge. Nothing is forwarded or NATed.

func (c *Config) bridgeName() string     { return c.Name + "-br" }
func (c *Config) netnsName(i int) string { return fmt.Sprintf("%s-a%d", c.Name, i) }
func (c *Config) vethName(i int) string  { return fmt.Sprintf("%s-a%d", c.Name, i) }
func (c *Config) peerName(i int) string  { return fmt.Sprintf("%s-p%d", c.Name, i) }

// bridgeAddr is the root namespace's address on the bridge; agentAddr
// agent i's (1-based) in its namespace.
func (c *Config) bridgeAddr() netip.Addr { return c.Subnet.Addr().Next() }
func (c *Config) agentAddr(i int) netip.Addr {
	a := c.Subnet.Addr().As4()
	a[3] += byte(10 + i)
	return netip.AddrFrom4(a)
}

// checkSubnet refuses a subnet that overlaps a network the machine
// already routes (other than this cluster's own bridge, left by a run
// that was killed).
func checkSubnet(cfg *Config) error {
	var routes []netlink.Route
	err := retryDump(func() (err error) { routes, err = netlink.RouteList(nil, netlink.FAMILY_V4); return err })
	if err != nil {
		return fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			continue // a default route
		}
		p, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		dst := netip.PrefixFrom(p.Unmap(), ones)
		if !dst.Overlaps(cfg.Subnet) {
			continue
		}
		dev := ""
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
			dev = l.Attrs().Name
		}
		if dev == cfg.bridgeName() {
			continue
		}
		return fmt.Errorf("subnet %s overlaps the route to %s on %s: choose another subnet", cfg.Subnet, dst, dev)
	}
	return nil
}

// setUpBridge makes the bridge with its address, up.
func setUpBridge(cfg *Config) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: cfg.bridgeName()}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", br.Name, err)
	}
	l, err := netlink.LinkByName(br.Name)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(cfg.bridgeAddr(), cfg.Subnet.Bits()))}
	if err := netlink.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, br.Name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bridge %s up: %w", br.Name, err)
	}
	return nil
}

// setUpAgentNet makes agent i's namespace and its veth pair on the
// bridge, and returns the namespace's path.
func setUpAgentNet(cfg *Config, i int) (string, error) {
	ns, err := nettest.CreateNS(cfg.netnsName(i))
	if err != nil {
		return "", err
	}
	defer ns.Close()
	br, err := netlink.LinkByName(cfg.bridgeName())
	if err != nil {
		return "", err
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: cfg.vethName(i), MasterIndex: br.Attrs().Index}, PeerName: cfg.peerName(i)}
	if err := netlink.LinkAdd(veth); err != nil {
		return "", fmt.Errorf("add veth %s: %w", veth.Name, err)
	}
	peer, err := netlink.LinkByName(cfg.peerName(i))
	if err != nil {
		return "", err
	}
	fd, err := unix.Open(ns.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	err = netlink.LinkSetNsFd(peer, fd)
	unix.Close(fd)
	if err != nil {
		return "", fmt.Errorf("move %s into %s: %w", cfg.peerName(i), ns.Name, err)
	}
	h := ns.Netlink()
	in, err := h.LinkByName(cfg.peerName(i))
	if err == nil {
		err = h.LinkSetName(in, "eth0")
	}
	if err == nil {
		err = h.AddrAdd(in, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(cfg.agentAddr(i), cfg.Subnet.Bits()))})
	}
	if err == nil {
		err = h.LinkSetUp(in)
	}
	if err != nil {
		return "", fmt.Errorf("eth0 of %s: %w", ns.Name, err)
	}
	root, err := netlink.LinkByName(cfg.vethName(i))
	if err == nil {
		err = netlink.LinkSetUp(root)
	}
	if err != nil {
		return "", fmt.Errorf("veth %s up: %w", cfg.vethName(i), err)
	}
	return ns.Path, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// removeNetwork removes the cluster's namespaces (after killing what
// still runs in them), veths and bridge, found by name: what this run
// made, or what a run that was killed left. It reports what it found
// still running and the names it removed.
func removeNetwork(name string) (killed []int, removed []string, err error) {
	ents, _ := os.ReadDir(network.NetnsDir)
	var errs []error
	for _, e := range ents {
		if !isOurs(name, e.Name()) {
			continue
		}
		path := filepath.Join(network.NetnsDir, e.Name())
		killed = append(killed, killIn(path)...)
		if err := network.UnbindNetns(path); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, "namespace "+e.Name())
	}
	var links []netlink.Link
	err = retryDump(func() (err error) { links, err = netlink.LinkList(); return err })
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if n := l.Attrs().Name; isOurs(name, n) && l.Type() != "bridge" {
			if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete %s: %w", n, err))
			}
			removed = append(removed, "veth "+n)
		}
	}
	if l, err := netlink.LinkByName(name + "-br"); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", name+"-br", err))
		}
		removed = append(removed, "bridge "+name+"-br")
	}
	return killed, removed, errors.Join(errs...)
}

// isOurs reports whether an interface or namespace name is one of the
// cluster's: NAME-br, NAME-aN, NAME-pN.
func isOurs(name, n string) bool {
	rest, ok := strings.CutPrefix(n, name+"-")
	if !ok {
		return false
	}
	if rest == "br" {
		return true
	}
	if len(rest) < 2 || (rest[0] != 'a' && rest[0] != 'p') {
		return false
	}
	_, err := strconv.Atoi(rest[1:])
	return err == nil
}

// killIn SIGKILLs every process in the network namespace bound at path
// (an agent, its VMMs) and waits until they are gone.
func killIn(path string) []int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if l, err := os.Readlink("/proc/" + e.Name() + "/ns/net"); err == nil && l == want {
			syscall.Kill(pid, syscall.SIGKILL)
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		testkit.WaitGone(pid, 10*time.Second)
	}
	return pids
}

// retryDump runs a netlink dump again while the kernel reports it was
// interrupted by a concurrent change (other namespaces and links come and
// go on a busy machine), a few times.
func retryDump(dump func() error) error {
	var err error
	for range 10 {
		if err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}
