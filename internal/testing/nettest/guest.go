package nettest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/hostagent/network"
)

// Guest stands in for a sandbox's VM: a namespace whose NIC "eth0" (a TAP,
// with network.GuestAddr, GuestMAC, default route via GatewayAddr) is
// joined to a sandbox's TapFD by a relay that copies frames both ways,
// adding and removing the virtio-net header, as QEMU would. Its kernel
// stack is a real one (ARP, TCP, conntrack-visible behaviour), so what a
// process in it sees is what a process in a guest would see.
//
// Until a real guest with a NIC boots in tests, this is how the host side
// is tested end to end.
type Guest struct {
	NS  *NS
	tap *os.File // the guest's NIC, no virtio-net header

	mu      sync.Mutex
	sandbox *os.File // the attached TapFD, or nil

	frames atomic.Int64 // frames relayed, both ways
}

var guestSeq atomic.Int64

// NewGuest makes a guest namespace (removed at the test's end) with its
// NIC up and attached to nothing.
func NewGuest(t testing.TB, e *Env) *Guest {
	t.Helper()
	g := &Guest{NS: NewNS(t, fmt.Sprintf("%s-g%d", e.Prefix, guestSeq.Add(1)))}
	var fd int
	err := g.NS.Do(func() (err error) {
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq("eth0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	must(t, err)
	g.tap = os.NewFile(uintptr(fd), "guest-eth0")
	h := g.NS.nl
	l, err := h.LinkByName("eth0")
	must(t, err)
	must(t, h.LinkSetHardwareAddr(l, network.GuestMAC))
	must(t, addrUp(h, "eth0", network.GuestAddr, network.GuestPrefix.Bits()))
	must(t, h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: network.GatewayAddr.AsSlice()}))
	go g.toSandbox()
	t.Cleanup(func() {
		g.Detach()
		g.tap.Close()
	})
	return g
}

// Attach joins the guest to a sandbox's TapFD (taking ownership of f),
// replacing any earlier one: what a restore of the guest into that
// sandbox's namespace looks like from the network.
func (g *Guest) Attach(f *os.File) {
	g.mu.Lock()
	old := g.sandbox
	g.sandbox = f
	g.mu.Unlock()
	if old != nil {
		old.Close()
	}
	go g.fromSandbox(f)
}

// Detach cuts the guest off its sandbox and closes the TapFD.
func (g *Guest) Detach() {
	g.mu.Lock()
	old := g.sandbox
	g.sandbox = nil
	g.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// Frames is how many frames the relay copied.
func (g *Guest) Frames() int64 { return g.frames.Load() }

// toSandbox copies the guest's outgoing frames to the attached TapFD.
func (g *Guest) toSandbox() {
	buf := make([]byte, network.VnetHdrLen+65536)
	for {
		n, err := g.tap.Read(buf[network.VnetHdrLen:])
		if err != nil {
			return
		}
		clear(buf[:network.VnetHdrLen])
		g.mu.Lock()
		if g.sandbox != nil {
			if _, err := g.sandbox.Write(buf[:network.VnetHdrLen+n]); err == nil {
				g.frames.Add(1)
			}
		}
		g.mu.Unlock()
	}
}

// fromSandbox copies frames from one TapFD into the guest until f closes.
func (g *Guest) fromSandbox(f *os.File) {
	buf := make([]byte, network.VnetHdrLen+65536)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		if n <= network.VnetHdrLen {
			continue
		}
		frame := buf[network.VnetHdrLen:n]
		if buf[0]&1 != 0 { // VIRTIO_NET_HDR_F_NEEDS_CSUM
			completeChecksum(frame, int(binary.LittleEndian.Uint16(buf[6:])), int(binary.LittleEndian.Uint16(buf[8:])))
		}
		if _, err := g.tap.Write(frame); err == nil {
			g.frames.Add(1)
		}
	}
}

// completeChecksum finishes a partial checksum: the 16-bit field at
// start+off holds the pseudo-header sum; the checksum covers start..end.
func completeChecksum(b []byte, start, off int) {
	if start+off+2 > len(b) {
		return
	}
	var sum uint32
	data := b[start:]
	for i := 0; i+1 < len(data); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(data[i:]))
	}
	if len(data)%2 == 1 {
		sum += uint32(data[len(data)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(b[start+off:], ^uint16(sum))
}

// DialContext connects from inside the guest (numeric addresses).
func (g *Guest) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return g.NS.DialContext(ctx, network, addr)
}

// Resolver resolves through the guest's DNS server (the gateway), as the
// guest's /etc/resolv.conf says. Use fully qualified names ("x.test.")
// so that no search domain of the machine is tried.
func (g *Guest) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, nw, _ string) (net.Conn, error) {
		return g.DialContext(ctx, nw, netip.AddrPortFrom(network.GatewayAddr, network.DNSPort).String())
	}}
}

// Exchange sends one DNS query from the guest to server ("ip:port") over
// nw ("udp" or "tcp").
func (g *Guest) Exchange(ctx context.Context, m *dns.Msg, nw, server string) (*dns.Msg, error) {
	c, err := g.DialContext(ctx, nw, server)
	if err != nil {
		return nil, err
	}
	co := &dns.Conn{Conn: c, UDPSize: dns.MaxMsgSize}
	defer co.Close()
	cl := &dns.Client{Net: nw, Timeout: 3 * time.Second, UDPSize: dns.MaxMsgSize}
	r, _, err := cl.ExchangeWithConnContext(ctx, m, co)
	return r, err
}

// Get fetches url from inside the guest, resolving its host through the
// guest's DNS server, and returns the body.
func (g *Guest) Get(ctx context.Context, url string) (string, error) {
	res := g.Resolver()
	client := &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, nw, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			if _, err := netip.ParseAddr(host); err != nil {
				ips, err := res.LookupNetIP(ctx, "ip4", dns.Fqdn(host))
				if err != nil {
					return nil, err
				}
				host = ips[0].String()
			}
			return g.DialContext(ctx, nw, net.JoinHostPort(host, port))
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// IsRefused reports whether err is what a rejected connection looks like
// to the guest: a TCP reset (ECONNREFUSED or ECONNRESET) or an ICMP
// prohibited (EHOSTUNREACH), not a timeout.
func IsRefused(err error) bool {
	return errors.Is(err, unix.ECONNREFUSED) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EHOSTUNREACH)
}
