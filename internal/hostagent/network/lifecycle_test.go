package network_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestNamespace checks what a namespace holds: names, sysctls, the TAP's
// flags and its one queue, DialContext to the guest, and Release.
func TestNamespace(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ctx := ctxT(t, 20*time.Second)
	ns, err := m.Acquire(ctx, netpolicy.Policy{}) // no internet: DialContext works anyway
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); !strings.Contains(string(out), ns.Name()) {
		t.Errorf("ip netns list does not show %s:\n%s", ns.Name(), out)
	}
	if len(ns.HostVeth()) > 15 {
		t.Errorf("veth name %q longer than 15", ns.HostVeth())
	}
	hl, err := env.Host.Netlink().LinkByName(ns.HostVeth())
	if err != nil || hl.Attrs().Alias != ns.Name() {
		t.Errorf("host veth %s: %v, alias %q; want alias %s", ns.HostVeth(), err, hl.Attrs().Alias, ns.Name())
	}
	in, err := nettest.OpenNS(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for key, want := range map[string]string{
		"net/netfilter/nf_conntrack_tcp_loose": "0",
		"net/ipv4/ip_forward":                  "1",
		"net/ipv6/conf/all/disable_ipv6":       "1",
	} {
		if got, err := in.Sysctl(key); strings.TrimSpace(got) != want {
			t.Errorf("%s in the namespace = %q (%v), want %s", key, got, err, want)
		}
	}
	if got, _ := env.Host.Sysctl("net/ipv4/ip_forward"); strings.TrimSpace(got) != "1" {
		t.Errorf("host ip_forward = %q", got)
	}
	tap, err := in.Netlink().LinkByName(network.TapName)
	if err != nil || tap.Attrs().HardwareAddr.String() != network.GatewayMAC.String() {
		t.Fatalf("%s: %v, mac %v; want %v", network.TapName, err, tap.Attrs().HardwareAddr, network.GatewayMAC)
	}

	f, err := ns.TapFD()
	if err != nil {
		t.Fatal(err)
	}
	ifr, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNGETIFF, ifr); err != nil {
		t.Fatal(err)
	}
	if flags := ifr.Uint16(); flags&(unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR) != unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR {
		t.Errorf("tap flags %#x, want TAP|NO_PI|VNET_HDR", flags)
	}
	if _, err := ns.TapFD(); !errors.Is(err, unix.EBUSY) {
		t.Errorf("second TapFD while the first is open: %v, want EBUSY", err)
	}
	g := nettest.NewGuest(t, env)
	g.Attach(f)

	// The port proxy's path: dial the guest from the namespace.
	l, err := g.NS.Listen("tcp4", hostPort(network.GuestAddr, 8080))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	c, err := ns.DialContext(ctx, "tcp4", hostPort(network.GuestAddr, 8080))
	if err != nil {
		t.Fatalf("DialContext to the guest: %v", err)
	}
	echo(t, c, "through the port proxy's path")
	c.Close()

	if err := ns.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := ns.Release(); err != nil {
		t.Fatalf("second Release: %v", err)
	}
	if _, err := ns.TapFD(); !errors.Is(err, network.ErrClosed) {
		t.Errorf("TapFD after Release: %v, want ErrClosed", err)
	}
	if left := leftovers(t, env, nsPrefix(ns)); len(left) != 1 || !strings.Contains(left[0], "host nft") {
		t.Errorf("after Release, want only the host table left, got %v", left)
	}
}

func nsPrefix(ns *network.Namespace) string { return ns.Name()[:strings.IndexByte(ns.Name(), '-')] }

// TestPool: Run fills the pool, Acquire takes from it without making one,
// Run refills it; with no pool Acquire makes one on the spot.
func TestPool(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{PoolSize: 2})
	if got := m.PoolLen(); got != 0 {
		t.Fatalf("New filled the pool (%d): it must start nothing", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testkit.WaitFor(t, 10*time.Second, "pool filled to 2", func() bool { return m.PoolLen() == 2 })
	ns, err := m.Acquire(ctxT(t, 5*time.Second), netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Stats(); s.Created != 0 {
		t.Fatalf("Acquire made a namespace (%+v) with a full pool", s)
	}
	testkit.WaitFor(t, 10*time.Second, "pool refilled to 2", func() bool { return m.PoolLen() == 2 })
	if s := m.Stats(); s.Owned != 3 {
		t.Fatalf("stats %+v, want 3 owned", s)
	}
	g := attach(t, env, ns)
	wantGet(t, g, url(nettest.WebAddr), nettest.WebAddr)

	// Pool namespaces deny everything until acquired: their forwarder
	// answers NXDOMAIN (checked by taking one with the zero policy).
	ns2, err := m.Acquire(ctxT(t, 5*time.Second), netpolicy.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	g2 := attach(t, env, ns2)
	if _, err := lookup(t, g2, "allowed.test."); !isNXDOMAIN(err) {
		t.Fatalf("zero policy lookup: %v, want NXDOMAIN", err)
	}

	m2 := newManager(t, env, network.Config{PoolSize: -1})
	if _, err := m2.Acquire(ctxT(t, 5*time.Second), netpolicy.Default()); err != nil {
		t.Fatal(err)
	}
	if s := m2.Stats(); s.Created != 1 {
		t.Fatalf("without a pool: stats %+v, want one created on the spot", s)
	}
}

// The crash helper: a process that makes namespaces and is killed.
const (
	helperEnv       = "PANDA_NETWORK_CRASH_HELPER"
	helperPrefixEnv = "PANDA_NETWORK_CRASH_PREFIX"
	helperHostEnv   = "PANDA_NETWORK_CRASH_HOST"
)

func crashHelper() {
	m, err := network.New(network.Config{Prefix: os.Getenv(helperPrefixEnv), HostNetNS: os.Getenv(helperHostEnv),
		Upstreams: []string{nettest.DNSAddr.String()}, PoolSize: 2})
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	go m.Run(context.Background())
	var names []string
	for range 2 {
		ns, err := m.Acquire(context.Background(), netpolicy.Default())
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(1)
		}
		names = append(names, ns.Name())
	}
	if !testkit.Poll(time.Minute, func() bool { return m.PoolLen() >= 2 }) {
		fmt.Println("ERR the pool never filled to 2")
		os.Exit(1)
	}
	fmt.Println("NS", strings.Join(names, " "))
	select {} // until killed
}

// TestCrashCleanupAdopt: a process that made namespaces is killed;
// Cleanup removes what is not kept, Adopt takes the kept one over (its
// DNS forwarder again), Close leaves nothing.
func TestCrashCleanupAdopt(t *testing.T) {
	env := nettest.NewEnv(t)
	prefix := testPrefix()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), helperEnv+"=1", helperPrefixEnv+"="+prefix, helperHostEnv+"="+env.Host.Path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Kill()
	cmd.Wait()
	names, ok := strings.CutPrefix(strings.TrimSpace(line), "NS ")
	if err != nil || !ok {
		t.Fatalf("helper said %q, %v", line, err)
	}
	acquired := strings.Fields(names)
	left := leftovers(t, env, prefix)
	if count(left, "namespace ") != 4 || count(left, "veth ") != 4 || count(left, "1 host nft") != 1 {
		t.Fatalf("the killed process left %v, want 4 namespaces (2 acquired, 2 pooled), 4 veths, its table", left)
	}

	m := newManager(t, env, network.Config{Prefix: prefix})
	keep := acquired[0]
	if err := m.Cleanup(ctxT(t, 10*time.Second), func(name string) bool { return name == keep }); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	left = leftovers(t, env, prefix)
	if count(left, "namespace ") != 1 || !slices.Contains(left, "namespace "+keep) || count(left, "veth ") != 1 {
		t.Fatalf("after Cleanup keeping %s: %v", keep, left)
	}
	if _, err := m.Adopt(ctxT(t, 5*time.Second), acquired[1], netpolicy.Default()); !errors.Is(err, network.ErrNotFound) {
		t.Fatalf("Adopt of a removed namespace: %v, want ErrNotFound", err)
	}
	ns, err := m.Adopt(ctxT(t, 5*time.Second), keep, netpolicy.Policy{AllowOut: []string{"allowed.test"}})
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	g := attach(t, env, ns)
	wantGet(t, g, "http://allowed.test/", nettest.WebAddr)
	wantRefused(t, g, hostPort(nettest.OtherAddr, 80))
	// Close (in newManager's cleanup) must then leave nothing.
}

// TestCleanupWhileCreating: Cleanup run while the manager makes a
// namespace (the pool fills as the server starts and cleans up) leaves
// that namespace and its veth alone at every step, and the sandbox given
// it reaches the network. (Seen: the pool's first namespace removed as
// "leftover" as it was made, and the fork child given it had a TAP that
// never came up.)
func TestCleanupWhileCreating(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	var steps []string
	network.SetCreateStep(func(step, name string) {
		steps = append(steps, step)
		if err := m.Cleanup(ctxT(t, 10*time.Second), nil); err != nil {
			t.Errorf("Cleanup at step %s: %v", step, err)
		}
	})
	t.Cleanup(func() { network.SetCreateStep(nil) })
	ns, err := m.Acquire(ctxT(t, 10*time.Second), netpolicy.Policy{AllowOut: []string{"allowed.test"}})
	network.SetCreateStep(nil)
	if err != nil {
		t.Fatalf("Acquire with a Cleanup at each step: %v", err)
	}
	if !slices.Equal(steps, []string{"netns", "veth"}) {
		t.Errorf("steps %v, want [netns veth]", steps)
	}
	g := attach(t, env, ns)
	wantGet(t, g, "http://allowed.test/", nettest.WebAddr)
	ns.Release()
}

func count(l []string, prefix string) int {
	n := 0
	for _, s := range l {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

// TestDetach: a process that exits keeping its sandboxes leaves their
// namespaces for the next one to adopt.
func TestDetach(t *testing.T) {
	env := nettest.NewEnv(t)
	prefix := testPrefix()
	m1, err := network.New(network.Config{Prefix: prefix, HostNetNS: env.Host.Path,
		Upstreams: []string{nettest.DNSAddr.String()}, PoolSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	ns, err := m1.Acquire(ctxT(t, 5*time.Second), netpolicy.Default())
	if err != nil {
		m1.Close()
		t.Fatal(err)
	}
	name := ns.Name()
	g := attach(t, env, ns)
	c, err := g.DialContext(ctxT(t, 3*time.Second), "tcp4", hostPort(nettest.WebAddr, nettest.EchoPort))
	if err != nil {
		m1.Close()
		t.Fatal(err)
	}
	defer c.Close()
	if err := m1.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	m2 := newManager(t, env, network.Config{Prefix: prefix})
	echo(t, c, "across the restart") // NAT and conntrack survived
	if err := m2.Cleanup(ctxT(t, 5*time.Second), func(n string) bool { return n == name }); err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Adopt(ctxT(t, 5*time.Second), name, netpolicy.Default()); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	wantGet(t, g, "http://other.test/", nettest.OtherAddr)
}

// The TCP_REPAIR socket options' queue numbers (linux/tcp.h).
const (
	tcpRecvQueue = 1
	tcpSendQueue = 2
)

// tcpState is what a fork copies of a TCP socket: its sequence numbers
// and windows, and its local port.
type tcpState struct {
	sndSeq, rcvSeq uint32
	window         [5]uint32 // struct tcp_repair_window
	localPort      int
}

func getsockoptBytes(fd, level, opt int, b []byte) error {
	l := uint32(len(b))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafePointer(b)), uintptr(unsafePointer32(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// captureTCP reads a live socket's state through TCP_REPAIR, as CRIU
// does, and lets it run on without a window probe.
func captureTCP(c *net.TCPConn) (tcpState, error) {
	var st tcpState
	st.localPort = c.LocalAddr().(*net.TCPAddr).Port
	rc, err := c.SyscallConn()
	if err != nil {
		return st, err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		s := int(fd)
		if serr = unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON); serr != nil {
			return
		}
		defer unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF_NO_WP)
		for _, q := range []struct {
			queue int
			seq   *uint32
		}{{tcpSendQueue, &st.sndSeq}, {tcpRecvQueue, &st.rcvSeq}} {
			if serr = unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q.queue); serr != nil {
				return
			}
			v, err := unix.GetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
			if serr = err; err != nil {
				return
			}
			*q.seq = uint32(v)
		}
		b := make([]byte, 20)
		if serr = getsockoptBytes(s, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, b); serr != nil {
			return
		}
		for i := range st.window {
			st.window[i] = nativeUint32(b[4*i:])
		}
	})
	return st, errors.Join(err, serr)
}

// restoreTCP makes, in the guest g, the socket a fork child's kernel
// holds: the same connection, the same sequence numbers.
func restoreTCP(g *nettest.Guest, st tcpState, remote *net.TCPAddr) (net.Conn, error) {
	var fd int
	err := g.NS.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		steps := []func() error{
			func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_ON) },
			func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpSendQueue) },
			func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ, int(st.sndSeq)) },
			func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, tcpRecvQueue) },
			func() error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ, int(st.rcvSeq)) },
			func() error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) },
			func() error {
				return unix.Bind(fd, &unix.SockaddrInet4{Port: st.localPort, Addr: network.GuestAddr.As4()})
			},
			func() error {
				ra := &unix.SockaddrInet4{Port: remote.Port}
				copy(ra.Addr[:], remote.IP.To4())
				return unix.Connect(fd, ra)
			},
			func() error {
				b := make([]byte, 20)
				for i, v := range st.window {
					putNativeUint32(b[4*i:], v)
				}
				return setsockoptBytes(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW, b)
			},
			func() error {
				return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, unix.TCP_REPAIR_OFF_NO_WP)
			},
		}
		for i, s := range steps {
			if err := s(); err != nil {
				unix.Close(fd)
				return fmt.Errorf("repair step %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "child-socket")
	defer f.Close()
	return net.FileConn(f)
}

// TestForkInheritedConnection: a fork child's guest holds a copy of its
// parent's TCP connection (same address, ports and sequence numbers, in
// a fresh namespace from the pool). When the child uses it, its namespace
// answers with a reset and nothing leaves the namespace: the peer never
// sees the child and keeps talking to the parent. The child opens new
// connections at once.
func TestForkInheritedConnection(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ctx := ctxT(t, 30*time.Second)
	parent, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	gp := attach(t, env, parent)
	pc, err := gp.DialContext(ctx, "tcp4", hostPort(nettest.WebAddr, nettest.EchoPort))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	echo(t, pc, "parent before;")

	// The fork: capture the parent's socket, make the child's namespace
	// and guest, and give the child's guest the same socket.
	st, err := captureTCP(pc.(*net.TCPConn))
	if err != nil {
		t.Fatalf("capture the parent's connection: %v", err)
	}
	child, err := m.Acquire(ctx, netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	gc := attach(t, env, child)
	childNS, err := nettest.OpenNS(child.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer childNS.Close()
	txPackets := func() uint64 {
		l, err := childNS.Netlink().LinkByName(network.UplinkName)
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Statistics.TxPackets
	}
	txBefore := txPackets()
	cc, err := restoreTCP(gc, st, pc.RemoteAddr().(*net.TCPAddr))
	if err != nil {
		t.Fatalf("restore the connection in the child: %v", err)
	}
	defer cc.Close()
	cc.SetDeadline(time.Now().Add(3 * time.Second))
	_, werr := cc.Write([]byte("child;"))
	_, rerr := cc.Read(make([]byte, 64))
	if !errors.Is(werr, unix.ECONNRESET) && !errors.Is(werr, unix.EPIPE) && !errors.Is(rerr, unix.ECONNRESET) {
		t.Fatalf("the child's inherited connection: write %v, read %v; want a reset", werr, rerr)
	}
	// The reset is the namespace's own (a write or read error, not the
	// deadline), and nothing went out: checked by the packet count.
	if tx := txPackets(); tx != txBefore {
		t.Fatalf("the child's namespace sent %d packets out of %s: the inherited connection reached the network", tx-txBefore, network.UplinkName)
	}

	// The parent's connection carries on; the peer saw only the parent.
	echo(t, pc, "parent after;")
	for _, c := range env.Echo.Conns() {
		if strings.Contains(c.Received.String(), "child") {
			t.Fatalf("the echo server received the child's bytes: %+v", c)
		}
		if strings.Contains(c.Received.String(), "parent before;") && (c.Done || c.Received.String() != "parent before;parent after;") {
			t.Fatalf("the parent's connection at the server: %q, done %v, err %v", c.Received.String(), c.Done, c.Err)
		}
	}
	// The child opens new connections at once.
	nc, err := gc.DialContext(ctx, "tcp4", hostPort(nettest.WebAddr, nettest.EchoPort))
	if err != nil {
		t.Fatalf("the child's new connection: %v", err)
	}
	defer nc.Close()
	echo(t, nc, "child's own;")
}

// TestCloseWhileBusy: Close while Run fills the pool and Acquires make
// namespaces: no panic, Run returns, Acquire fails with ErrClosed or
// succeeds, and nothing is left (checked by newManager's cleanup).
func TestCloseWhileBusy(t *testing.T) {
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{PoolSize: 3})
	done := make(chan error, 1)
	go func() { done <- m.Run(context.Background()) }()
	acquired := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := m.Acquire(context.Background(), netpolicy.Default())
			acquired <- err
		}()
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for range 4 {
		if err := <-acquired; err != nil && !errors.Is(err, network.ErrClosed) {
			t.Errorf("Acquire during Close: %v", err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if _, err := m.Acquire(context.Background(), netpolicy.Default()); !errors.Is(err, network.ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
}
