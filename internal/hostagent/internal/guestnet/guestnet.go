// Package guestnet owns the network every guest sees, and the simplest
// host side for it.
//
// Every sandbox's guest has the same address, MAC, gateway and DNS server
// (the constants below). The initramfs's /init (scripts/guest-init.sh, which
// holds the same values; a test checks that they agree) configures them when
// a template is baked, and every restore and fork of it continues with them:
// a new sandbox needs no reconfiguration inside the guest, only a TAP device
// on the host (vmm.Net) whose other side is the gateway: GatewayIP/PrefixLen
// and GatewayMAC. The guest never asks for the gateway's MAC (it holds a
// permanent neighbour entry for it), so the host side of every sandbox's TAP
// must carry GatewayMAC.
//
// Isolated gives a machine such a TAP in a network namespace of its own that
// has no way out: the NIC of a bake when nobody passes another, of tests, and
// of sandboxes on a host whose networking is off.
package guestnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"

	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The guest's network, the same in every sandbox.
const (
	// GuestIf is the guest's interface, configured at boot.
	GuestIf = "eth0"
	// GuestIP is the guest's address on GuestIf, in a /PrefixLen network
	// whose other address is GatewayIP.
	GuestIP   = "100.96.0.2"
	PrefixLen = 30
	// GuestMAC is the MAC address of every guest's NIC (vmm.Net.MAC).
	GuestMAC = "52:54:00:70:6e:02"
	// GatewayIP is the guest's default route and DNS server: the host's
	// side of the TAP device.
	GatewayIP = "100.96.0.1"
	// GatewayMAC must be the MAC address of the host's side of the TAP.
	GatewayMAC = "52:54:00:70:6e:01"
	// DNS is the guest's name server (/etc/resolv.conf).
	DNS = GatewayIP
)

// TAPFlags are the flags of every TAP device a machine gets (vmm.Net).
const TAPFlags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR

// isolatedTAP is the name of the TAP device in an isolated namespace.
const isolatedTAP = "tap0"

// Isolated returns a NIC for one machine: a TAP device (TAPFlags, MAC
// GuestMAC) in a new network namespace that holds only it and a loopback
// interface that is down. The TAP is up with the gateway's address and MAC,
// so the guest finds its gateway, which answers pings and refuses
// connections; the namespace has no other interface and no route, so
// nothing the guest sends goes further.
//
// It leaves nothing anywhere but the returned file: the namespace and the
// TAP device exist only as long as a descriptor of the TAP is open (the
// caller's, or the VMM's copy once the file was passed to one) and vanish
// with the last one. It needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
func Isolated() (*vmm.Net, error) {
	type result struct {
		f   *os.File
		err error
	}
	done := make(chan result, 1)
	// On a goroutine of its own, locked to its thread: the thread enters
	// the new namespace and goes back to the process's. If it cannot go
	// back, the goroutine ends still locked, and the runtime then
	// terminates the thread instead of running anything else in the
	// namespace.
	go func() {
		runtime.LockOSThread()
		f, back, err := isolatedOnThread()
		done <- result{f, err}
		if back {
			runtime.UnlockOSThread()
		}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("isolated network: %w", r.err)
	}
	return &vmm.Net{TAP: r.f, MAC: GuestMAC}, nil
}

// isolatedOnThread builds the namespace from the calling thread, which it
// moves into the namespace and back; back reports whether it is back in
// the process's namespace.
func isolatedOnThread() (f *os.File, back bool, err error) {
	orig, err := netns.Get()
	if err != nil {
		return nil, true, fmt.Errorf("get network namespace: %w", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		return nil, true, fmt.Errorf("new network namespace: %w", err)
	}
	// The namespace lives on through the TAP's descriptor, not this one.
	ns.Close()
	defer func() {
		back = netns.Set(orig) == nil
		if !back && err == nil {
			f.Close()
			f, err = nil, errors.New("cannot return to the host's network namespace")
		}
	}()
	f, err = OpenTAP(isolatedTAP)
	if err != nil {
		return nil, back, err
	}
	if err := gatewaySide(isolatedTAP); err != nil {
		f.Close()
		return nil, back, err
	}
	if err := refuseBeyondGateway(isolatedTAP); err != nil {
		f.Close()
		return nil, back, err
	}
	return f, back, nil
}

// refuseBeyondGateway makes the gateway answer what the guest sends
// beyond it with ICMP "network unreachable", in the calling thread's
// network namespace, which must have no route but the guest's network:
// without it the kernel drops such packets silently (a host that does not
// forward answers nothing), and a guest's connection to an address hangs
// until its TCP gives up, minutes later (a Dockerfile RUN step with no
// network, a sandbox on a host whose networking is off). With forwarding
// on the TAP and no route, the kernel refuses them at once; nothing can be
// forwarded anywhere, since the namespace has no other interface.
func refuseBeyondGateway(name string) error {
	// /proc/sys/net is the opening thread's namespace's.
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+name+"/forwarding", []byte("1"), 0); err != nil {
		return fmt.Errorf("answer for the unreachable on %s: %w", name, err)
	}
	return nil
}

// OpenTAP creates the TAP device name (TAPFlags, not persistent: it goes
// away with its last descriptor) in the calling thread's network namespace
// and returns its descriptor, close-on-exec. The caller must hold its
// goroutine on that thread (runtime.LockOSThread).
func OpenTAP(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	ifr.SetUint16(TAPFlags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// gatewaySide makes the TAP device name the guest's gateway, in the
// calling thread's network namespace: GatewayMAC, GatewayIP/PrefixLen, no
// IPv6 (no router solicitations queued for a guest that ignores them), up.
func gatewaySide(name string) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	// /proc/sys/net is the opening thread's namespace's.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disable ipv6 on %s: %w", name, err)
	}
	mac, _ := net.ParseMAC(GatewayMAC)
	if err := h.LinkSetHardwareAddr(link, mac); err != nil {
		return fmt.Errorf("set mac of %s: %w", name, err)
	}
	addr, err := netlink.ParseAddr(fmt.Sprintf("%s/%d", GatewayIP, PrefixLen))
	if err != nil {
		return err
	}
	if err := h.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring up %s: %w", name, err)
	}
	return nil
}

// IsolatedNIC is Isolated in the shape of the hooks that give a machine
// its NIC (template.Config.Net): release closes the TAP, which takes the
// namespace away once the VMM's copy is gone too. purpose is unused.
func IsolatedNIC(ctx context.Context, purpose string) (nic *vmm.Net, release func(), err error) {
	nic, err = Isolated()
	if err != nil {
		return nil, nil, err
	}
	tap := nic.TAP
	return nic, func() { tap.Close() }, nil
}
