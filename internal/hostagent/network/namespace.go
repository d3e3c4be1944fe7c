package network

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// maxLearned bounds the addresses one sandbox's forwarder keeps allowed
// for allow-listed names.
const maxLearned = 8192

// Namespace is one sandbox's network: a network namespace holding TapName
// and UplinkName, its veth's host end, its table and its DNS forwarder.
// Its methods are safe for concurrent use.
type Namespace struct {
	m        *Manager
	name     string
	idx      int
	hostVeth string
	hostAddr netip.Addr
	nsAddr   netip.Addr

	fd  int             // the namespace, open
	nl  *netlink.Handle // netlink inside it
	fwd *forwarder

	mu       sync.Mutex // guards everything below, and nft's batches
	nft      *nftables.Conn
	policy   *compiled
	learned  map[netip.Addr]learned
	released bool
}

// learned is an address the forwarder answered for allow-listed names.
type learned struct {
	names   map[string]bool
	expires time.Time
}

// Name is the namespace's name in NetnsDir ("<prefix>-<8 hex>"): what a
// caller records to Adopt it after a restart or to keep it in Cleanup.
func (ns *Namespace) Name() string { return ns.name }

// Path is the namespace's file, for setns(2) or `ip netns exec`.
func (ns *Namespace) Path() string { return filepath.Join(NetnsDir, ns.name) }

// HostVeth is the name of the veth's end in the host namespace.
func (ns *Namespace) HostVeth() string { return ns.hostVeth }

// HostAddr is the address of the veth's host end; NamespaceAddr that of
// UplinkName, the address the guest is masqueraded to.
func (ns *Namespace) HostAddr() netip.Addr      { return ns.hostAddr }
func (ns *Namespace) NamespaceAddr() netip.Addr { return ns.nsAddr }

// Policy is the policy in force.
func (ns *Namespace) Policy() netpolicy.Policy {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.policy == nil {
		return netpolicy.Policy{}
	}
	p := ns.policy.policy
	p.AllowOut, p.DenyOut = append([]string(nil), p.AllowOut...), append([]string(nil), p.DenyOut...)
	return p
}

// TapFD opens a new descriptor on the namespace's TAP (IFF_TAP, IFF_NO_PI,
// IFF_VNET_HDR; non-blocking, close-on-exec) for QEMU's
// `-netdev tap,id=N,fd=3 -device virtio-net-device,netdev=N,mac=GuestMAC`
// (QEMU reads the vnet header flag from the descriptor; vnet_hdr= is not
// allowed with fd=). The caller owns and closes it. A TAP has one queue:
// while a descriptor is open (a running VMM's), another TapFD fails with
// EBUSY. Frames carry a VnetHdrLen-byte virtio-net header. It returns
// once the kernel has the TAP's carrier up.
func (ns *Namespace) TapFD() (*os.File, error) {
	ns.mu.Lock()
	released := ns.released
	ns.mu.Unlock()
	if released {
		return nil, ErrClosed
	}
	f, err := openTap(ns.fd, TapName)
	if err != nil {
		return nil, fmt.Errorf("open tap of %s: %w", ns.name, err)
	}
	if err := ns.waitTapUp(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// waitTapUp waits until the kernel has handled the TAP's carrier coming
// on (its operational state is up): until then it has no active qdisc
// and drops what it should send to the guest (the guest's first ARP
// answer, say). It takes well under a millisecond here, thanks to the
// qdisc installed at creation.
func (ns *Namespace) waitTapUp() error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := ns.nl.LinkByName(TapName)
		if err != nil {
			return fmt.Errorf("tap of %s: %w", ns.name, err)
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tap of %s: carrier not up after 2s (state %s)", ns.name, l.Attrs().OperState)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// DialContext makes a connection from inside the namespace, as the
// gateway would: for the port proxy, dial GuestAddr:PORT. The policy does
// not apply to it. addr must be numeric.
func (ns *Namespace) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ns.mu.Lock()
	released := ns.released
	ns.mu.Unlock()
	if released {
		return nil, ErrClosed
	}
	return netnsDialer{fd: ns.fd}.DialContext(ctx, network, addr)
}

// SetPolicy replaces the policy while the sandbox runs: the sets and the
// default verdict change in one netlink batch; connections already
// established stay up. Addresses the forwarder allowed for names that the
// new policy still allows stay allowed. Errors: a *PolicyError
// (ErrInvalidPolicy), ErrClosed.
func (ns *Namespace) SetPolicy(ctx context.Context, p netpolicy.Policy) error {
	c, err := compile(p)
	if err != nil {
		return err
	}
	return ns.setPolicy(c)
}

func (ns *Namespace) setPolicy(c *compiled) error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.released {
		return ErrClosed
	}
	now := time.Now()
	keep := map[netip.Addr]learned{}
	var dns []learnedAddr
	for a, l := range ns.learned {
		if !l.expires.After(now.Add(time.Second)) {
			continue
		}
		for n := range l.names {
			if c.resolve(n) == nameAllowListed {
				keep[a] = l
				dns = append(dns, learnedAddr{a, l.expires})
				break
			}
		}
	}
	t := &nftables.Table{Name: ns.m.cfg.Prefix, Family: nftables.TableFamilyIPv4}
	if err := queuePolicy(ns.nft, t, c, dns); err != nil {
		return err
	}
	if err := ns.nft.Flush(); err != nil {
		return fmt.Errorf("set policy of %s: %w", ns.name, err)
	}
	ns.policy, ns.learned = c, keep
	ns.fwd.policy.Store(c)
	return nil
}

// learn allows addrs, which the forwarder answered for name, for at least
// ttl (Config.DNSMinTimeout at least), if the policy still allow-lists
// name. It returns when the kernel has them, before the guest gets the
// answer.
func (ns *Namespace) learn(name string, addrs []netip.Addr, ttl time.Duration) error {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.released {
		return ErrClosed
	}
	if ns.policy.resolve(name) != nameAllowListed {
		return nil // the policy changed since the query was decided
	}
	now := time.Now()
	expires := now.Add(max(ttl, ns.m.cfg.DNSMinTimeout))
	if len(ns.learned)+len(addrs) > maxLearned {
		maps.DeleteFunc(ns.learned, func(_ netip.Addr, l learned) bool { return !l.expires.After(now) })
		if len(ns.learned)+len(addrs) > maxLearned {
			return errors.New("too many allowed addresses")
		}
	}
	var add, renew []learnedAddr
	for _, a := range addrs {
		l, ok := ns.learned[a]
		switch {
		case !ok || !l.expires.After(now):
			add = append(add, learnedAddr{a, expires})
		case l.expires.Before(expires.Add(-ns.m.cfg.DNSMinTimeout / 4)):
			renew = append(renew, learnedAddr{a, expires})
		}
	}
	if len(add)+len(renew) > 0 {
		t := &nftables.Table{Name: ns.m.cfg.Prefix, Family: nftables.TableFamilyIPv4}
		_, _, set := sandboxSets(t)
		if len(renew) > 0 {
			// Re-adding an element does not extend its timeout on every
			// kernel: delete and add it in one batch.
			if err := ns.nft.SetDeleteElements(set, timeoutElements(renew, now.Add(-time.Hour))); err != nil {
				return err
			}
		}
		if err := ns.nft.SetAddElements(set, timeoutElements(append(add, renew...), now)); err != nil {
			return err
		}
		if err := ns.nft.Flush(); err != nil {
			if len(renew) == 0 {
				return err
			}
			// An element we meant to renew expired in the kernel first:
			// add them all.
			if err2 := ns.nft.SetAddElements(set, timeoutElements(append(add, renew...), now)); err2 != nil {
				return err2
			}
			if err := ns.nft.Flush(); err != nil {
				return err
			}
		}
	}
	for _, a := range addrs {
		l := ns.learned[a]
		if l.names == nil || !l.expires.After(now) {
			l = learned{names: map[string]bool{}}
		}
		l.names[name] = true
		l.expires = later(l.expires, expires)
		ns.learned[a] = l
	}
	return nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Release removes the namespace: its forwarder, veth (both ends), table,
// TAP and its name in NetnsDir. A VMM still holding a TapFD is cut off
// (the namespace and its TAP linger, unnamed and unconnected, until that
// descriptor closes). Idempotent.
func (ns *Namespace) Release() error {
	return ns.destroy()
}

// open opens the namespace by name and a netlink handle in it.
func (ns *Namespace) open() error {
	fd, err := openNetns(ns.Path())
	if err != nil {
		return err
	}
	ns.fd = fd
	if ns.nl, err = netlink.NewHandleAt(netns.NsHandle(fd)); err != nil {
		return fmt.Errorf("netlink in %s: %w", ns.name, err)
	}
	return nil
}

// configureLinks sets addresses, routes and the gateway's neighbour entry
// of a new namespace whose veth exists.
func (ns *Namespace) configureLinks() error {
	m := ns.m
	hl, err := m.host.LinkByName(ns.hostVeth)
	if err != nil {
		return fmt.Errorf("find veth %s: %w", ns.hostVeth, err)
	}
	// The alias ties the veth to its namespace for Cleanup.
	if err := m.host.LinkSetAlias(hl, ns.name); err != nil {
		return fmt.Errorf("alias %s: %w", ns.hostVeth, err)
	}
	if err := m.host.AddrAdd(hl, &netlink.Addr{IPNet: ipnet(ns.hostAddr, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", ns.hostVeth, err)
	}
	if err := m.host.LinkSetUp(hl); err != nil {
		return fmt.Errorf("up %s: %w", ns.hostVeth, err)
	}
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("up lo: %w", err)
	}
	eth, err := ns.nl.LinkByName(UplinkName)
	if err != nil {
		return fmt.Errorf("find %s: %w", UplinkName, err)
	}
	if err := ns.nl.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(ns.nsAddr, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", UplinkName, err)
	}
	if err := ns.nl.LinkSetUp(eth); err != nil {
		return fmt.Errorf("up %s: %w", UplinkName, err)
	}
	tap, err := ns.nl.LinkByName(TapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", TapName, err)
	}
	if err := ns.nl.LinkSetHardwareAddr(tap, GatewayMAC); err != nil {
		return fmt.Errorf("mac of %s: %w", TapName, err)
	}
	if err := ns.nl.AddrAdd(tap, &netlink.Addr{IPNet: ipnet(GatewayAddr, GuestPrefix.Bits())}); err != nil {
		return fmt.Errorf("address %s: %w", TapName, err)
	}
	if err := ns.nl.LinkSetUp(tap); err != nil {
		return fmt.Errorf("up %s: %w", TapName, err)
	}
	// A TAP without a reader has no carrier, so it came up without a
	// qdisc; when QEMU attaches, the kernel would then activate it in its
	// rate-limited (up to 1 s) link watch, dropping what it sends to the
	// guest until then: the first ARP answer, say. A qdisc installed now
	// makes carrier-on an urgent event, handled at once.
	if err := ns.nl.QdiscReplace(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: tap.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		QdiscType: "pfifo_fast"}); err != nil {
		return fmt.Errorf("qdisc of %s: %w", TapName, err)
	}
	if err := ns.nl.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: ns.hostAddr.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// The guest answers ARP too, but a fixed entry saves the first
	// packet toward a restored guest a round trip.
	if err := ns.nl.NeighAdd(&netlink.Neigh{LinkIndex: tap.Attrs().Index, Family: netlink.FAMILY_V4,
		State: netlink.NUD_PERMANENT, IP: GuestAddr.AsSlice(), HardwareAddr: GuestMAC}); err != nil {
		return fmt.Errorf("neighbour %s: %w", GuestAddr, err)
	}
	return nil
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// start installs the namespace's table with policy c and starts its
// forwarder.
func (ns *Namespace) start(c *compiled) error {
	m := ns.m
	cc, err := nftables.New(nftables.WithNetNSFd(ns.fd), nftables.AsLasting())
	if err != nil {
		return fmt.Errorf("nftables in %s: %w", ns.name, err)
	}
	ns.mu.Lock()
	ns.nft = cc
	ns.learned = map[netip.Addr]learned{}
	if err := queueSandboxTable(cc, m.cfg.Prefix, c, nil); err != nil {
		ns.mu.Unlock()
		return err
	}
	if err := cc.Flush(); err != nil {
		ns.mu.Unlock()
		return fmt.Errorf("install table in %s: %w", ns.name, err)
	}
	ns.policy = c
	ns.mu.Unlock()
	ns.fwd = &forwarder{
		upstreams: m.upstreams,
		timeout:   m.cfg.DNSTimeout,
		maxAnswer: m.cfg.DNSMaxAnswer,
		dial:      m.hostDialer().DialContext,
		learn:     ns.learn,
		filter:    m.filter.Load,
		log:       m.log.With("netns", ns.name),
		limiter:   newTokenBucket(m.cfg.DNSQueriesPerSecond),
	}
	ns.fwd.policy.Store(c)
	return ns.fwd.start(ns.fd)
}

// destroy removes everything of the namespace and forgets it.
func (ns *Namespace) destroy() error {
	ns.mu.Lock()
	if ns.released {
		ns.mu.Unlock()
		return nil
	}
	ns.released = true
	ns.mu.Unlock()
	ns.m.hostMu.RLock()
	err := ns.destroyObjects()
	ns.m.hostMu.RUnlock()
	ns.m.forget(ns)
	return err
}

// destroyObjects removes the namespace's kernel objects and closes its
// handles; a missing one is not an error. The caller holds m.hostMu for
// reading. Only the veth is deleted
// explicitly (one device unregistration, ~30 ms here): without it the
// namespace is cut off, and its TAP goes with the namespace, at once or
// when the last descriptor on it (a VMM's) closes.
func (ns *Namespace) destroyObjects() error {
	var errs []error
	if ns.fwd != nil {
		ns.fwd.stop()
	}
	deleted := false
	if ns.hostVeth != "" && ns.m.host != nil {
		if l, err := ns.m.host.LinkByName(ns.hostVeth); err == nil && l.Attrs().Alias == ns.name {
			if err := ns.m.host.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", ns.hostVeth, err))
			} else {
				deleted = true
			}
		}
	}
	if !deleted && ns.nl != nil {
		if l, err := ns.nl.LinkByName(UplinkName); err == nil {
			if err := ns.nl.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete %s in %s: %w", UplinkName, ns.name, err))
			}
		}
	}
	ns.closeHandles()
	if err := removeNetns(ns.name); err != nil {
		errs = append(errs, fmt.Errorf("remove namespace %s: %w", ns.name, err))
	}
	return errors.Join(errs...)
}

// detach stops the forwarder and closes the handles, leaving the kernel
// objects for a later Adopt, and forgets the namespace.
func (ns *Namespace) detach() {
	ns.m.hostMu.RLock()
	defer ns.m.hostMu.RUnlock()
	ns.detachLocked()
}

// detachLocked is detach for a caller holding m.hostMu for reading.
func (ns *Namespace) detachLocked() {
	ns.mu.Lock()
	if ns.released {
		ns.mu.Unlock()
		return
	}
	ns.released = true
	ns.mu.Unlock()
	if ns.fwd != nil {
		ns.fwd.stop()
	}
	ns.closeHandles()
	ns.m.forget(ns)
}

func (ns *Namespace) closeHandles() {
	ns.mu.Lock()
	if ns.nft != nil {
		ns.nft.CloseLasting()
		ns.nft = nil
	}
	ns.mu.Unlock()
	if ns.nl != nil {
		ns.nl.Close()
		ns.nl = nil
	}
	if ns.fd >= 0 {
		unix.Close(ns.fd)
		ns.fd = -1
	}
}

// forget drops a namespace the Manager no longer owns.
func (m *Manager) forget(ns *Namespace) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.owned[ns.name] == ns {
		delete(m.owned, ns.name)
		if ns.idx >= 0 {
			delete(m.used, ns.idx)
		}
	}
	for i, p := range m.pool {
		if p == ns {
			m.pool = append(m.pool[:i], m.pool[i+1:]...)
			break
		}
	}
}
