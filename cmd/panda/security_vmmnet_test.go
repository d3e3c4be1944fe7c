package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// TestSecurityVMMNamespaces: the QEMU of a sandbox shares no network, IPC
// or PID namespace with the server (issue 31, finding 7). Replayed as a
// guest escape would use it: from the VMM's network namespace the
// server's API, which the test reaches in the server's namespace, does
// not answer; neither would the cloud metadata service or a loopback
// service: the namespace has nothing but lo, down.
func TestSecurityVMMNamespaces(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.Alice)
	pid := vmmPID(t, w.DataDir(), sb.ID)
	// The server's IPC and PID namespaces are its process's; its network
	// namespace is the world's host namespace (a thread of the server
	// may be in a sandbox's for a moment).
	var host unix.Stat_t
	if err := unix.Stat(w.env.Host.Path, &host); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"net", "ipc", "pid"} {
		server, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", w.PID(), ns))
		if ns == "net" {
			server = fmt.Sprintf("net:[%d]", host.Ino)
		}
		vmm, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 != nil || err2 != nil || server == vmm {
			t.Errorf("%s namespace: server's %q (%v), vmm's %q (%v); want different ones", ns, server, err1, vmm, err2)
		}
	}
	u, err := url.Parse(w.URL())
	if err != nil {
		t.Fatal(err)
	}
	api := u.Host
	if code, b := w.mustDo(t, ctx, w.Alice, "GET", "/v1/sandboxes/"+sb.ID, nil, nil); code != 200 {
		t.Fatalf("control: GET the sandbox from the server's namespace: %d %s", code, b)
	}
	var ifaces []net.Interface
	err = inNetnsOf(pid, func() error {
		ifaces, err = net.Interfaces()
		if err != nil {
			return err
		}
		if c, err := net.DialTimeout("tcp", api, 5*time.Second); err == nil {
			c.Close()
			t.Errorf("from the vmm's network namespace the server's API at %s answered", api)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ifaces) != 1 || ifaces[0].Name != "lo" || ifaces[0].Flags&net.FlagUp != 0 {
		t.Errorf("the vmm's network namespace has %v, want only lo, down", ifaces)
	}
	// The guest's own network is unaffected.
	wantReach(t, ctx, sb, "http://allowed.test/", nettest.Hello(nettest.WebAddr))
}

// inNetnsOf runs fn on an OS thread in the network namespace of process
// pid; the thread is discarded afterwards.
func inNetnsOf(pid int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter the network namespace of %d: %w", pid, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestSecurityDNSInternalZones: a sandbox's resolver tells it nothing of
// the networks around the host (issue 31, finding 12): a name whose
// record points into a private range, or that a public zone rebinds to
// 127.0.0.1, answers no address, and the reverse name of a private
// address is not asked of the host's resolver; public names resolve.
func TestSecurityDNSInternalZones(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w.env.AddRecord("intranet.secdns.test", nettest.PrivateNetAddr)
	w.env.AddRecord("rebind.secdns.test", nettest.HostUplinkAddr)
	w.env.AddPTR(nettest.PrivateNetAddr, "intranet.secdns.test")
	sb := w.sandbox(t, ctx, w.Alice)
	lookup := func(arg string) string {
		r, err := sb.Exec(ctx, pandastack.Command{Cmd: "nslookup " + arg + " 2>&1; true"})
		if err != nil {
			t.Fatalf("nslookup %s: %v", arg, err)
		}
		return r.Stdout
	}
	if out := lookup("other.test"); !strings.Contains(out, nettest.OtherAddr.String()) {
		t.Errorf("nslookup other.test: %q, want %s", out, nettest.OtherAddr)
	}
	for _, tc := range []struct{ arg, secret string }{
		{"intranet.secdns.test", nettest.PrivateNetAddr.String()},
		{"rebind.secdns.test", nettest.HostUplinkAddr.String()},
		{nettest.PrivateNetAddr.String(), "intranet.secdns.test"},
	} {
		if out := lookup(tc.arg); strings.Contains(out, tc.secret) {
			t.Errorf("nslookup %s in the sandbox told it %s:\n%s", tc.arg, tc.secret, out)
		}
	}
}
