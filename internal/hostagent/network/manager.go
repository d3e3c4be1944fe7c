package network

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/google/nftables"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Errors of the Manager and its namespaces (errors.Is), each of a class
// of internal/contract/errs.
var (
	// ErrClosed: the Manager was closed, or the namespace released.
	ErrClosed = errs.New(errs.Unavailable, "network manager closed")
	// ErrExhausted: no /30 left in Config.Pool.
	ErrExhausted = errs.New(errs.Unavailable, "network address pool exhausted")
	// ErrNotFound: Adopt found no such namespace.
	ErrNotFound = errs.New(errs.NotFound, "network namespace not found")
)

// Manager owns every namespace, veth, table and DNS forwarder of its
// prefix on one host. Its methods are safe for concurrent use.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	upstreams []string

	hostFD      int  // the host namespace, open
	hostCurrent bool // the host namespace is the process's own
	host        *netlink.Handle
	hostNFT     *nftables.Conn
	nameRE      *regexp.Regexp // our namespace names
	vethRE      *regexp.Regexp // our host veth names

	refill chan struct{} // a namespace left the pool

	// filter is what the DNS forwarders keep out of answers: htable's
	// blocked ranges less the operator's exceptions, replaced whenever
	// htable's are.
	filter atomic.Pointer[addrFilter]

	// hostMu guards host, hostNFT and hostFD against closeHost: whatever
	// uses them holds it for reading, closeHost for writing. Never taken
	// while holding mu.
	hostMu sync.RWMutex

	mu     sync.Mutex
	closed bool
	pool   []*Namespace          // prepared, not handed out
	owned  map[string]*Namespace // every live namespace of this Manager, pool included
	// creating names the namespaces being made (create), from before
	// they exist until they are owned: Cleanup must not take them for
	// an earlier process's leftovers.
	creating map[string]bool
	used     map[int]bool // /30 indexes in use (or found taken)
	htable   hostTable
	created  int // namespaces made on the spot by Acquire (metric)
}

// New checks cfg, installs the host table (replacing one an earlier
// process left), and enables IPv4 forwarding in the host namespace. It
// starts no goroutine: call Run to fill the pool, and Cleanup once to
// remove what an earlier process left.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("network config: %w", err)
	}
	cfg = cfg.withDefaults()
	m := &Manager{
		cfg:    cfg,
		log:    cfg.Logger,
		refill: make(chan struct{}, 1),
		hostFD: -1,
		owned:  map[string]*Namespace{}, creating: map[string]bool{},
		used:   map[int]bool{},
		nameRE: regexp.MustCompile(`^` + cfg.Prefix + `-[0-9a-f]{8}$`),
		vethRE: regexp.MustCompile(`^` + cfg.Prefix + `([0-9]+)$`),
	}
	if len(cfg.Upstreams) == 0 {
		ups, err := m.hostUpstreams()
		if err != nil {
			return nil, fmt.Errorf("dns upstreams: %w", err)
		}
		m.upstreams = ups
	} else {
		for _, u := range cfg.Upstreams {
			ap, _ := upstreamAddr(u)
			m.upstreams = append(m.upstreams, ap.String())
		}
	}
	ok := false
	defer func() {
		if !ok {
			m.closeHost()
		}
	}()
	path := cfg.HostNetNS
	if path == "" {
		path = "/proc/self/ns/net"
		m.hostCurrent = true
	}
	fd, err := openNetns(path)
	if err != nil {
		return nil, err
	}
	m.hostFD = fd
	if m.host, err = netlink.NewHandleAt(netns.NsHandle(fd)); err != nil {
		return nil, fmt.Errorf("netlink in host namespace: %w", err)
	}
	if err := EnsureNetnsDir(); err != nil {
		return nil, err
	}
	if m.hostNFT, err = nftables.New(nftables.WithNetNSFd(fd), nftables.AsLasting()); err != nil {
		return nil, fmt.Errorf("nftables in host namespace: %w", err)
	}
	nets, err := m.hostSubnets()
	if err != nil {
		return nil, err
	}
	for _, n := range nets {
		if n.Overlaps(cfg.Pool) && n.Bits() < cfg.Pool.Bits() {
			return nil, fmt.Errorf("pool %s lies inside host network %s: choose another Pool", cfg.Pool, n)
		}
	}
	m.htable = hostTable{prefix: cfg.Prefix, pool: cfg.Pool, allowed: cfg.AllowedHostNets, blocked: m.blockedNets(nets)}
	m.filter.Store(m.htable.filter())
	if err := m.htable.queue(m.hostNFT); err != nil {
		return nil, err
	}
	if err := m.hostNFT.Flush(); err != nil {
		return nil, fmt.Errorf("install host table %s: %w", cfg.Prefix, err)
	}
	if err := m.inHost(func() error { return writeSysctl("net/ipv4/ip_forward", "1") }); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// inHost runs fn in the host namespace.
func (m *Manager) inHost(fn func() error) error {
	if m.hostCurrent {
		return fn()
	}
	return inNetns(m.hostFD, fn)
}

// hostDialer dials from the host namespace (the DNS forwarders' upstream
// queries).
func (m *Manager) hostDialer() netnsDialer {
	if m.hostCurrent {
		return netnsDialer{fd: -1}
	}
	return netnsDialer{fd: m.hostFD}
}

// hostSubnets lists the IPv4 subnets of the host's interfaces, except
// this Manager's veths.
func (m *Manager) hostSubnets() ([]netip.Prefix, error) {
	links, err := m.host.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list host links: %w", err)
	}
	var out []netip.Prefix
	for _, l := range links {
		if m.vethRE.MatchString(l.Attrs().Name) {
			continue
		}
		addrs, err := m.host.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			if !ok {
				continue
			}
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr())*64 + a.Bits() - b.Bits() })
	return slices.Compact(out), nil
}

func (m *Manager) blockedNets(hostNets []netip.Prefix) []netip.Prefix {
	out := append(slices.Clone(alwaysBlocked), m.cfg.Pool)
	return append(out, hostNets...)
}

// refreshHostNets re-reads the host's subnets and updates the blocked set
// if they changed.
func (m *Manager) refreshHostNets() error {
	m.hostMu.RLock()
	defer m.hostMu.RUnlock()
	if m.host == nil {
		return nil
	}
	nets, err := m.hostSubnets()
	if err != nil {
		return err
	}
	blocked := m.blockedNets(nets)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || slices.Equal(blocked, m.htable.blocked) {
		return nil
	}
	h := m.htable
	h.blocked = blocked
	if err := h.queueBlocked(m.hostNFT); err != nil {
		return err
	}
	if err := m.hostNFT.Flush(); err != nil {
		return fmt.Errorf("update blocked host networks: %w", err)
	}
	m.htable = h
	m.filter.Store(h.filter())
	m.log.Info("network: host networks changed", "blocked", fmt.Sprint(blocked))
	return nil
}

// Run keeps the pool filled and the always-blocked host subnets current
// until ctx ends; then it returns nil. A namespace it cannot make is
// logged and retried with backoff. Call it once.
func (m *Manager) Run(ctx context.Context) error {
	refresh := time.NewTicker(m.cfg.HostNetsRefresh)
	defer refresh.Stop()
	backoff := time.Duration(0)
	for {
		if err := m.fillPool(ctx); err != nil && ctx.Err() == nil {
			if errors.Is(err, ErrClosed) {
				return nil
			}
			backoff = min(max(2*backoff, time.Second), 30*time.Second)
			m.log.Warn("network: cannot prepare a namespace", "err", err, "retry_in_ms", backoff.Milliseconds())
		} else {
			backoff = 0
		}
		var retry <-chan time.Time
		if backoff > 0 {
			retry = time.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-m.refill:
		case <-retry:
		case <-refresh.C:
			if err := m.refreshHostNets(); err != nil {
				m.log.Warn("network: cannot refresh host networks", "err", err)
			}
		}
	}
}

// fillPool makes namespaces until the pool is full.
func (m *Manager) fillPool(ctx context.Context) error {
	for ctx.Err() == nil {
		m.mu.Lock()
		closed, n := m.closed, len(m.pool)
		m.mu.Unlock()
		if closed {
			return ErrClosed
		}
		if n >= m.cfg.PoolSize {
			return nil
		}
		ns, err := m.create()
		if err != nil {
			return err
		}
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			ns.destroy()
			return ErrClosed
		}
		m.pool = append(m.pool, ns)
		m.mu.Unlock()
	}
	return nil
}

// PoolLen is how many prepared namespaces wait in the pool.
func (m *Manager) PoolLen() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pool)
}

// Acquire hands out a namespace with policy p: a prepared one from the
// pool, or one made on the spot if the pool is empty. The namespace is the
// caller's until it calls Release (or the Manager is closed). Errors: a
// *PolicyError (ErrInvalidPolicy) for a bad policy, ErrClosed,
// ErrExhausted, or a failure of the kernel.
func (m *Manager) Acquire(ctx context.Context, p netpolicy.Policy) (*Namespace, error) {
	c, err := compile(p)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	var ns *Namespace
	if n := len(m.pool); n > 0 {
		ns = m.pool[0]
		m.pool = slices.Delete(m.pool, 0, 1)
	}
	m.mu.Unlock()
	select {
	case m.refill <- struct{}{}:
	default:
	}
	if ns == nil {
		if ns, err = m.create(); err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.created++
		m.mu.Unlock()
	}
	if err := ns.setPolicy(c); err != nil {
		ns.Release()
		return nil, err
	}
	return ns, nil
}

func randomHex8() string {
	var b [4]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// allocIndex reserves the lowest free /30 of the pool.
func (m *Manager) allocIndex() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 1 << (32 - m.cfg.Pool.Bits() - 2)
	for i := range n {
		if !m.used[i] {
			m.used[i] = true
			return i, nil
		}
	}
	return 0, ErrExhausted
}

// subnetAddr is the address host (1) or namespace (2) of /30 number idx.
func (m *Manager) subnetAddr(idx, host int) netip.Addr {
	b := m.cfg.Pool.Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) + uint32(idx)*4 + uint32(host)
	return netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, v)))
}

// indexOf is the /30 number of a namespace-side address, or -1.
func (m *Manager) indexOf(a netip.Addr) int {
	if !m.cfg.Pool.Contains(a) {
		return -1
	}
	b, base := a.As4(), m.cfg.Pool.Addr().As4()
	off := binary.BigEndian.Uint32(b[:]) - binary.BigEndian.Uint32(base[:])
	if off%4 != 2 {
		return -1
	}
	return int(off / 4)
}

func (m *Manager) vethName(idx int) string { return m.cfg.Prefix + strconv.Itoa(idx) }

// create makes a namespace with everything in it and a deny-all policy.
func (m *Manager) create() (*Namespace, error) {
	m.hostMu.RLock()
	defer m.hostMu.RUnlock()
	if m.host == nil {
		return nil, ErrClosed
	}
	var ns *Namespace
	for attempt := 0; ; attempt++ {
		idx, err := m.allocIndex()
		if err != nil {
			return nil, err
		}
		ns, err = m.createAt(idx)
		if err == nil {
			break
		}
		if errors.Is(err, errVethTaken) && attempt < 64 {
			continue // leave idx marked used: something else holds it
		}
		m.mu.Lock()
		delete(m.used, idx)
		m.mu.Unlock()
		return nil, err
	}
	m.mu.Lock()
	delete(m.creating, ns.name)
	if m.closed {
		m.mu.Unlock()
		ns.destroyObjects() // hostMu is held
		return nil, ErrClosed
	}
	m.owned[ns.name] = ns
	m.mu.Unlock()
	return ns, nil
}

// createStep, if set (by tests), runs in createAt at each step of making
// namespace name before the manager owns it: "netns" once the namespace
// exists, "veth" once its host veth does (before that names it).
var createStep func(step, name string)

var errVethTaken = errors.New("veth name taken")

func (m *Manager) createAt(idx int) (*Namespace, error) {
	var name string
	// The name is the manager's before the namespace exists (creating),
	// until create owns it or this fails.
	forget := func(name string) {
		m.mu.Lock()
		delete(m.creating, name)
		m.mu.Unlock()
	}
	for {
		name = m.cfg.Prefix + "-" + randomHex8()
		m.mu.Lock()
		m.creating[name] = true
		m.mu.Unlock()
		err := createNetns(name, func() error {
			if err := nsSysctls(); err != nil {
				return err
			}
			return createTap(TapName)
		})
		if errors.Is(err, os.ErrExist) {
			forget(name)
			continue
		}
		if err != nil {
			forget(name)
			return nil, fmt.Errorf("create namespace %s: %w", name, err)
		}
		break
	}
	if createStep != nil {
		createStep("netns", name)
	}
	ns := &Namespace{m: m, name: name, idx: idx, hostVeth: m.vethName(idx), fd: -1,
		hostAddr: m.subnetAddr(idx, 1), nsAddr: m.subnetAddr(idx, 2)}
	ok := false
	defer func() {
		if !ok {
			ns.destroyObjects()
			forget(name)
		}
	}()
	if err := ns.open(); err != nil {
		return nil, err
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: ns.hostVeth},
		PeerName: UplinkName, PeerNamespace: netlink.NsFd(ns.fd)}
	if err := m.host.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			ns.hostVeth = "" // not ours: do not delete it
			return nil, fmt.Errorf("%w: %s", errVethTaken, m.vethName(idx))
		}
		return nil, fmt.Errorf("create veth %s: %w", ns.hostVeth, err)
	}
	if createStep != nil {
		createStep("veth", name)
	}
	if err := ns.configureLinks(); err != nil {
		return nil, err
	}
	if err := ns.start(&compiled{}); err != nil {
		return nil, err
	}
	ok = true
	return ns, nil
}

// nsSysctls sets a new sandbox namespace's sysctls, on a thread inside it.
func nsSysctls() error {
	for _, s := range []struct{ key, val string }{
		{"net/ipv6/conf/all/disable_ipv6", "1"},
		{"net/ipv6/conf/default/disable_ipv6", "1"},
		{"net/ipv4/ip_forward", "1"},
		{"net/netfilter/nf_conntrack_tcp_loose", "0"},
	} {
		err := writeSysctl(s.key, s.val)
		if err != nil && errors.Is(err, os.ErrNotExist) && filepath.Dir(s.key) != "net/netfilter" {
			continue // a kernel without IPv6
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// writeSysctl writes /proc/sys/key as seen by the calling thread's
// network namespace.
func writeSysctl(key, val string) error {
	if err := os.WriteFile("/proc/sys/"+key, []byte(val), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, val, err)
	}
	return nil
}

// Adopt takes over the namespace name that an earlier process of this
// prefix left (its veth, its table, its TAP and whatever QEMU still holds
// it), rebuilds its table with policy p and starts its DNS forwarder
// again. Errors: ErrNotFound if there is no such namespace of this
// prefix, a *PolicyError, ErrClosed.
func (m *Manager) Adopt(ctx context.Context, name string, p netpolicy.Policy) (*Namespace, error) {
	c, err := compile(p)
	if err != nil {
		return nil, err
	}
	if !m.nameRE.MatchString(name) {
		return nil, fmt.Errorf("%w: %q is not a namespace name of prefix %s", ErrNotFound, name, m.cfg.Prefix)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if ns := m.owned[name]; ns != nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("adopt %s: already owned by this manager", name)
	}
	m.mu.Unlock()
	m.hostMu.RLock()
	defer m.hostMu.RUnlock()
	if m.host == nil {
		return nil, ErrClosed
	}
	ns := &Namespace{m: m, name: name, fd: -1, idx: -1}
	if err := ns.open(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return nil, err
	}
	fail := func(err error) (*Namespace, error) {
		ns.closeHandles()
		return nil, fmt.Errorf("adopt %s: %w", name, err)
	}
	link, err := ns.nl.LinkByName(UplinkName)
	if err != nil {
		return fail(fmt.Errorf("%w: no %s in it", ErrNotFound, UplinkName))
	}
	addrs, err := ns.nl.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fail(err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && m.indexOf(ip) >= 0 {
			ns.idx = m.indexOf(ip)
		}
	}
	if ns.idx < 0 {
		return fail(fmt.Errorf("%w: its %s has no address of pool %s", ErrNotFound, UplinkName, m.cfg.Pool))
	}
	ns.hostVeth, ns.hostAddr, ns.nsAddr = m.vethName(ns.idx), m.subnetAddr(ns.idx, 1), m.subnetAddr(ns.idx, 2)
	if _, err := m.host.LinkByName(ns.hostVeth); err != nil {
		return fail(fmt.Errorf("host veth %s: %w", ns.hostVeth, err))
	}
	if err := inNetns(ns.fd, nsSysctls); err != nil {
		return fail(err)
	}
	m.mu.Lock()
	if m.closed || m.owned[name] != nil {
		m.mu.Unlock()
		return fail(fmt.Errorf("manager closed or namespace adopted twice"))
	}
	m.owned[name] = ns
	m.used[ns.idx] = true
	m.mu.Unlock()
	if err := ns.start(c); err != nil {
		ns.detachLocked()
		return nil, fmt.Errorf("adopt %s: %w", name, err)
	}
	return ns, nil
}

// Cleanup removes every namespace of this prefix that this Manager does
// not own and keep does not keep (keep may be nil), with its veth and its
// table, and every host veth of this prefix whose namespace is gone or
// not kept: what an earlier process left when it crashed. Call it before
// Adopt; a kept namespace's veth is left alone.
func (m *Manager) Cleanup(ctx context.Context, keep func(name string) bool) error {
	if keep == nil {
		keep = func(string) bool { return false }
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	m.mu.Unlock()
	// Whether a name is this manager's is asked when it is met, not from
	// a list made before: a namespace the pool is making meanwhile exists
	// only once its name is (creating), so it is never taken for a
	// leftover (a race seen at start: the pool's first namespace removed
	// as it was made, and the sandbox given it had a TAP that never came
	// up).
	owned := func(name string) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.owned[name] != nil || m.creating[name]
	}
	m.hostMu.RLock()
	defer m.hostMu.RUnlock()
	if m.host == nil {
		return ErrClosed
	}
	var errs []error
	entries, err := os.ReadDir(NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	kept := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if !m.nameRE.MatchString(name) || owned(name) {
			continue
		}
		if keep(name) {
			kept[name] = true
			continue
		}
		if err := removeLeftover(name); err != nil {
			errs = append(errs, err)
		} else {
			m.log.Info("network: removed leftover namespace", "netns", name)
		}
	}
	links, err := m.host.LinkList()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, l := range links {
		a := l.Attrs()
		if !m.vethRE.MatchString(a.Name) || owned(a.Alias) || kept[a.Alias] || (a.Alias == "" && m.indexInUse(a.Name)) {
			continue
		}
		if err := m.host.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete veth %s: %w", a.Name, err))
		} else {
			m.log.Info("network: removed leftover veth", "veth", a.Name)
		}
	}
	return errors.Join(errs...)
}

// indexInUse reports whether host veth name (of vethRE) is of a /30 this
// manager holds: a namespace being made has its veth before the veth
// names it (LinkSetAlias).
func (m *Manager) indexInUse(name string) bool {
	idx, err := strconv.Atoi(m.vethRE.FindStringSubmatch(name)[1])
	if err != nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used[idx]
}

// removeLeftover deletes the links of a namespace nobody owns (its veth's
// host end goes with its eth0) and unbinds it.
func removeLeftover(name string) error {
	fd, err := openNetns(filepath.Join(NetnsDir, name))
	if err == nil {
		if h, err := netlink.NewHandleAt(netns.NsHandle(fd)); err == nil {
			if links, err := h.LinkList(); err == nil {
				for _, l := range links {
					if l.Attrs().Name != "lo" {
						h.LinkDel(l)
					}
				}
			}
			h.Close()
		}
		unix.Close(fd)
	}
	if err := removeNetns(name); err != nil {
		return fmt.Errorf("remove namespace %s: %w", name, err)
	}
	return nil
}

// Detach stops every DNS forwarder and lets go of every namespace without
// removing the ones handed out (and the host table), for a process that
// exits while its VMMs keep running; the next process Adopts them. The
// pool's namespaces are removed. The Manager is closed afterwards.
func (m *Manager) Detach() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	pool := m.pool
	m.pool = nil
	var active []*Namespace
	for _, ns := range m.owned {
		if !slices.Contains(pool, ns) {
			active = append(active, ns)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, ns := range pool {
		errs = append(errs, ns.destroy())
	}
	for _, ns := range active {
		ns.detach()
	}
	m.closeHost()
	return errors.Join(errs...)
}

// Close releases everything: every namespace (handed out or pooled), its
// veth, its table and its forwarder, and the host table. Run returns.
// Idempotent. IPv4 forwarding stays enabled in the host namespace.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.pool = nil
	all := make([]*Namespace, 0, len(m.owned))
	for _, ns := range m.owned {
		all = append(all, ns)
	}
	m.mu.Unlock()
	var errs []error
	for _, ns := range all {
		errs = append(errs, ns.destroy())
	}
	m.hostMu.Lock() // waits for creates, adopts and releases in flight
	t := &nftables.Table{Name: m.cfg.Prefix, Family: nftables.TableFamilyIPv4}
	m.hostNFT.AddTable(t)
	m.hostNFT.DelTable(t)
	if err := m.hostNFT.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete host table: %w", err))
	}
	m.closeHostLocked()
	m.hostMu.Unlock()
	select {
	case m.refill <- struct{}{}:
	default:
	}
	return errors.Join(errs...)
}

func (m *Manager) closeHost() {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	m.closeHostLocked()
}

func (m *Manager) closeHostLocked() {
	if m.hostNFT != nil {
		m.hostNFT.CloseLasting()
		m.hostNFT = nil
	}
	if m.host != nil {
		m.host.Close()
		m.host = nil
	}
	if m.hostFD >= 0 {
		unix.Close(m.hostFD)
		m.hostFD = -1
	}
}

// Stats are counters of a Manager.
type Stats struct {
	Pool    int // prepared namespaces waiting
	Owned   int // namespaces of this Manager, pool included
	Created int // namespaces Acquire had to make on the spot
}

// Stats reports the Manager's counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Stats{Pool: len(m.pool), Owned: len(m.owned), Created: m.created}
}
