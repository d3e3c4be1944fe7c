// Package nettest builds, for tests, a small world of network namespaces
// that stands in for a host and the internet, so that sandbox traffic
// never reaches the machine's real uplink, its cloud metadata address or
// any outside address — not even to check that it is blocked.
//
//	"host" namespace (<p>-host)                   "internet" namespace (<p>-inet)
//	  uplink0 198.18.0.1/30 ─────── veth ───────── eth0 198.18.0.2/30
//	  priv0   10.88.0.1/24 (a host network)        srv0: 203.0.113.10 (web, echo)
//	  HTTP :80 on every address ("the host")             203.0.113.53 (DNS)
//	  default via 198.18.0.2                             198.51.100.10/.20/.30
//	                                                     169.254.169.254 (metadata)
//	                                                     10.77.0.10 (a private network)
//	                                                     HTTP :80, echo :7 on all of them
//
// Point network.Config.HostNetNS at Env.Host.Path and Upstreams at DNSAddr,
// and the Manager treats the test's host namespace as the host. Guest is a
// stand-in for a VM: a namespace with the guest's address on a TAP whose
// frames a relay copies to and from a sandbox's TapFD, as QEMU would.
//
// For an end-to-end test, start `panda up` inside Env.Host with NS.Start
// (its sandboxes' uplink is then the test's internet) and point it at
// DNSAddr; every address the test servers answer on is in this package.
//
// MainInNewNetns should wrap a test binary's TestMain, so that even a
// test that forgets its Env runs in an empty namespace of its own.
//
// Everything here needs root. It is for tests (NewEnv, NewNS report
// failures through testing.TB and clean up at the test's end) and for
// benchmarks that must keep sandbox traffic in a world of their own
// (Build, CreateNS return errors and are removed with Env.Close,
// NS.Remove).
package nettest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// envChild marks the re-executed test binary.
const envChild = "PANDA_NETTEST_NETNS_CHILD"

// MainInNewNetns runs the tests (m.Run) in a new, empty network namespace:
// the test binary re-executes itself there and exits with the child's
// status. Without root, and under -short (where testkit's root gate skips
// every test that needs the namespace), it runs the tests as they are.
func MainInNewNetns(m *testing.M) {
	flag.Parse()
	if os.Getenv(envChild) != "" || os.Geteuid() != 0 || testing.Short() {
		os.Exit(m.Run())
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nettest:", err)
		os.Exit(2)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), envChild+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "nettest: re-exec in a new network namespace:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

// InChild reports whether this process is the re-executed test binary.
func InChild() bool { return os.Getenv(envChild) != "" }

// NS is a network namespace a test made (or opened), by name in
// /run/netns.
type NS struct {
	Name  string
	Path  string
	fd    int
	nl    *netlink.Handle
	owned bool // made by CreateNS: Remove unbinds it
}

// NewNS makes the namespace name with lo up, removed at the test's end
// (with everything in it).
func NewNS(t testing.TB, name string) *NS {
	t.Helper()
	n, err := CreateNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Remove)
	return n
}

// CreateNS makes the namespace name (bound in /run/netns) with lo up and
// IPv6 off. Remove it when done: that removes everything in it once
// nothing else holds it.
func CreateNS(name string) (*NS, error) {
	path := filepath.Join(network.NetnsDir, name)
	if err := network.EnsureNetnsDir(); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves with the goroutine
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			errc <- err
			return
		}
		f.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	n, err := OpenNS(path)
	if err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return nil, err
	}
	n.Name = name
	n.owned = true
	n.sysctl("net/ipv6/conf/all/disable_ipv6", "1")
	n.sysctl("net/ipv6/conf/default/disable_ipv6", "1")
	lo, err := n.nl.LinkByName("lo")
	if err == nil {
		err = n.nl.LinkSetUp(lo)
	}
	if err != nil {
		n.Remove()
		return nil, fmt.Errorf("lo up in %s: %w", name, err)
	}
	return n, nil
}

// Remove closes n's handles and, for a namespace CreateNS made, unbinds
// it from /run/netns. Idempotent.
func (n *NS) Remove() {
	n.Close()
	if n.owned {
		network.UnbindNetns(n.Path)
		n.owned = false
	}
}

// OpenNS opens an existing namespace by path (a sandbox's, say). Close
// it when done.
func OpenNS(path string) (*NS, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	nl, err := netlink.NewHandleAt(netns.NsHandle(fd))
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &NS{Name: filepath.Base(path), Path: path, fd: fd, nl: nl}, nil
}

// Close closes the namespace's handles (not the namespace).
func (n *NS) Close() {
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.fd >= 0 {
		unix.Close(n.fd)
		n.fd = -1
	}
}

// Netlink is a netlink handle inside the namespace.
func (n *NS) Netlink() *netlink.Handle { return n.nl }

// Do runs fn on an OS thread inside the namespace (a thread that ends
// with it). Sockets fn makes stay in the namespace.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (n *NS) sysctl(key, val string) error {
	return n.Do(func() error { return os.WriteFile("/proc/sys/"+key, []byte(val), 0o644) })
}

// Sysctl reads /proc/sys/key as the namespace sees it.
func (n *NS) Sysctl(key string) (string, error) {
	var s string
	err := n.Do(func() error {
		b, err := os.ReadFile("/proc/sys/" + key)
		s = string(b)
		return err
	})
	return s, err
}

// DialContext connects from inside the namespace (numeric addresses).
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() (err error) {
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket listens inside the namespace.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := n.Do(func() (err error) {
		l, err = net.ListenPacket(network, addr)
		return err
	})
	return l, err
}

// Start starts cmd inside the namespace (the child inherits the starting
// thread's namespace): e.g. `panda up` for an end-to-end test. The
// starting thread ends right after, so do not set SysProcAttr.Pdeathsig
// (Linux ties it to that thread: the child would be killed at once);
// kill the process in a t.Cleanup instead.
func (n *NS) Start(cmd *exec.Cmd) error {
	return n.Do(cmd.Start)
}

// HTTPClient is a client whose connections start inside the namespace.
// It resolves nothing: use numeric URLs.
func (n *NS) HTTPClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: n.DialContext, DisableKeepAlives: true, Proxy: nil}}
}
