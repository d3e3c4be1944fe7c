package qemu

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/internal/memimage"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// These tests attach guests to TAP devices in network namespaces the test
// makes: the namespace side of each TAP is the guests' gateway, and the
// namespace has no other interface and no route, so no guest traffic ever
// leaves it.

// testNet is a network namespace holding one TAP device whose namespace
// side is the guests' gateway (guestnet.GatewayIP/PrefixLen, GatewayMAC).
type testNet struct {
	ns  netns.NsHandle
	tap *os.File
}

// newTestNet makes a testNet, removed when the test ends (the namespace
// and the TAP vanish with the last descriptor: the test's and a VMM's).
func newTestNet(t testing.TB) *testNet {
	t.Helper()
	needRoot(t)
	type made struct {
		ns  netns.NsHandle
		tap *os.File
		err error
	}
	c := make(chan made, 1)
	go func() {
		runtime.LockOSThread() // never unlocked if the thread cannot go back: it dies
		orig, err := netns.Get()
		if err != nil {
			c <- made{err: err}
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			c <- made{err: err}
			return
		}
		tap, err := guestnet.OpenTAP("tap0")
		if err := netns.Set(orig); err != nil {
			c <- made{err: err}
			return
		}
		runtime.UnlockOSThread()
		c <- made{ns, tap, err}
	}()
	m := <-c
	if m.err != nil {
		t.Fatalf("make a test network: %v", m.err)
	}
	n := &testNet{ns: m.ns, tap: m.tap}
	t.Cleanup(func() { n.tap.Close(); n.ns.Close() })
	h := n.handle(t)
	defer h.Close()
	link, err := h.LinkByName("tap0")
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(guestnet.GatewayMAC)
	addr, _ := netlink.ParseAddr(fmt.Sprintf("%s/%d", guestnet.GatewayIP, guestnet.PrefixLen))
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{h.LinkSetHardwareAddr(link, mac), h.AddrAdd(link, addr), h.LinkSetUp(link), h.LinkSetUp(lo)} {
		if err != nil {
			t.Fatalf("configure the test network: %v", err)
		}
	}
	return n
}

func (n *testNet) handle(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// nic is a network interface on n's TAP.
func (n *testNet) nic() *vmm.Net { return &vmm.Net{TAP: n.tap, MAC: guestnet.GuestMAC} }

// run runs argv in n.
func (n *testNet) run(ctx context.Context, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(n.ns))}, argv...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ping pings addr from n until it answers, for up to 20 s.
func (n *testNet) ping(t testing.TB, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		out, err := n.run(ctx, "busybox", "ping", "-c", "1", "-W", "1", addr)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s does not answer pings from the test network: %v: %s", addr, err, out)
		}
	}
}

// neighbourMAC is the MAC n's namespace has learnt for ip.
func (n *testNet) neighbourMAC(t testing.TB, ip string) string {
	t.Helper()
	h := n.handle(t)
	defer h.Close()
	neighs, err := h.NeighList(0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, nb := range neighs {
		if nb.IP.String() == ip {
			return nb.HardwareAddr.String()
		}
	}
	return ""
}

// serveDNS answers DNS queries sent to the gateway's port 53 in n: A
// records of names, NXDOMAIN for other names, no AAAA records.
func (n *testNet) serveDNS(t testing.TB, names map[string]string) {
	t.Helper()
	c := make(chan net.PacketConn, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(n.ns); err != nil {
			errc <- err
			return
		}
		// The socket belongs to the namespace it was made in.
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(guestnet.GatewayIP, "53"))
		if err := netns.Set(orig); err != nil {
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			errc <- err
			return
		}
		c <- pc
	}()
	var pc net.PacketConn
	select {
	case pc = <-c:
	case err := <-errc:
		t.Fatalf("dns server: %v", err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := dnsAnswer(buf[:k], names); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
}

// dnsAnswer answers the query q from names (name → IPv4 address).
func dnsAnswer(q []byte, names map[string]string) []byte {
	if len(q) < 12 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l&0xc0 != 0 || i+1+l > len(q) {
			return nil
		}
		labels = append(labels, string(q[i+1:i+1+l]))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[i+1:])
	resp := append([]byte(nil), q[:i+5]...)
	resp[2] = 0x84 | q[2]&0x01 // response, authoritative, recursion desired as asked
	resp[3] = 0x80             // recursion available, no error
	binary.BigEndian.PutUint16(resp[4:], 1)
	binary.BigEndian.PutUint16(resp[6:], 0)
	binary.BigEndian.PutUint32(resp[8:], 0)
	ip, ok := names[strings.ToLower(strings.Join(labels, "."))]
	switch {
	case !ok:
		resp[3] |= 3 // NXDOMAIN
	case qtype == 1:
		binary.BigEndian.PutUint16(resp[6:], 1)
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
		resp = append(resp, net.ParseIP(ip).To4()...)
	}
	return resp
}

// restoreOn restores a machine from f attached to nic (nil: none) and
// says HELLO.
func restoreOn(t testing.TB, d *Driver, f files, nic *vmm.Net) *vm {
	t.Helper()
	return restoreTemplate(t, d, tiny(t), f, nic)
}

// restoreTemplate restores a machine of template tp from f attached to nic.
func restoreTemplate(t testing.TB, d *Driver, tp *template.Template, f files, nic *vmm.Net) *vm {
	t.Helper()
	dir := shortDir(t)
	spec := tp.Spec(template.Images{Dir: testkit.Images()})
	spec.RunDir = filepath.Join(dir, "run")
	spec.Disk = filepath.Join(dir, "disk")
	spec.MemoryFile = filepath.Join(dir, "mem")
	spec.Net = nic
	if err := os.Mkdir(spec.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.CopySparse(t, f.disk, spec.Disk)
	if err := os.Link(f.mem, spec.MemoryFile); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	v := &vm{m: m.(*Machine), spec: spec}
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	v.client = guestproto.NewClient(conn)
	t.Cleanup(func() { v.client.Close() })
	if err := m.LoadState(ctx, f.state); err != nil {
		t.Fatal(err)
	}
	if err := m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.client.Hello(ctx, guestproto.HelloRequest{Hostname: "net"}); err != nil {
		t.Fatalf("hello: %v", err)
	}
	return v
}

// capture saves v as a fork does (device state, dirty pages over its
// memory file, a copy of its disk) and resumes it.
func capture(t *testing.T, v *vm) files {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.client.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	c := files{mem: filepath.Join(dir, "mem"), state: filepath.Join(dir, "state"), disk: filepath.Join(dir, "disk")}
	if err := v.m.SaveState(ctx, c.state); err != nil {
		t.Fatal(err)
	}
	r, err := v.m.RAMMapping()
	if err != nil {
		t.Fatal(err)
	}
	region := memimage.Region{PID: r.PID, Start: r.Start, Size: r.Size}
	pm, err := memimage.Scan(region)
	if err != nil {
		t.Fatal(err)
	}
	copyFile := func(src, dst string) error {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	if _, err := memimage.Write(c.mem, v.spec.MemoryFile, copyFile, region, pm.Dirty); err != nil {
		t.Fatal(err)
	}
	testkit.CopySparse(t, v.spec.Disk, c.disk)
	if err := v.m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.client.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// checkGuestNet checks the network the guest of v configured at boot, and
// that it reaches its gateway and is reached from it through n.
func checkGuestNet(t *testing.T, v *vm, n *testNet) {
	t.Helper()
	n.ping(t, guestnet.GuestIP)
	if got := n.neighbourMAC(t, guestnet.GuestIP); got != guestnet.GuestMAC {
		t.Errorf("the gateway sees the guest at MAC %q, want %q", got, guestnet.GuestMAC)
	}
	// The guest reaches its gateway at once: it never ARPs for it. (base
	// has no ping: a connection the gateway refuses reached it too.)
	v.sh(t, fmt.Sprintf(`if command -v ping >/dev/null; then ping -c 1 -W 5 %[1]s; else python3 -c '
import socket
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("%[1]s", 9))
except ConnectionRefusedError:
    pass
'; fi`, guestnet.GatewayIP))
	for cmd, want := range map[string]string{
		"cat /sys/class/net/eth0/address":                       guestnet.GuestMAC + "\n",
		"cat /etc/resolv.conf":                                  "nameserver " + guestnet.DNS + "\n",
		"ip -4 -o addr show dev eth0 | grep -o 'inet [0-9./]*'": fmt.Sprintf("inet %s/%d\n", guestnet.GuestIP, guestnet.PrefixLen),
		// The routing table, the same through busybox and iproute2:
		// default via the gateway, the /30 on eth0, nothing else.
		"awk 'NR > 1 {print $1, $2, $3, $8}' /proc/net/route": "eth0 00000000 " + hexIP(guestnet.GatewayIP) + " 00000000\n" +
			"eth0 " + hexIP("100.96.0.0") + " 00000000 " + hexMask(guestnet.PrefixLen) + "\n",
		"awk '{print $6}' /proc/net/if_inet6":                                     "lo\n",                              // IPv6 on lo only
		"awk '$1 == \"" + guestnet.GatewayIP + "\" {print $3, $4}' /proc/net/arp": "0x6 " + guestnet.GatewayMAC + "\n", // complete, permanent
	} {
		if got := v.sh(t, cmd); got != want {
			t.Errorf("guest: %s: %q, want %q", cmd, got, want)
		}
	}
}

// hexIP is ip as /proc/net/route shows it (host byte order, in hex).
func hexIP(ip string) string {
	return fmt.Sprintf("%08X", binary.LittleEndian.Uint32(net.ParseIP(ip).To4()))
}

func hexMask(bits int) string {
	return fmt.Sprintf("%08X", binary.LittleEndian.Uint32(net.CIDRMask(bits, 32)))
}

// TestNetwork restores a guest onto a TAP device in a namespace of the
// test's and checks its network from both sides: addresses, route, MAC,
// DNS through the gateway, pings both ways.
func TestNetwork(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	n := newTestNet(t)
	n.serveDNS(t, map[string]string{"probe.panda.test": "192.0.2.7", "localhost": "192.0.2.99"})
	v := restoreOn(t, d, templateFiles(t), n.nic())
	checkGuestNet(t, v, n)
	// Names: busybox's own resolver, and getaddrinfo of the static libc
	// busybox is built with (/etc/hosts before DNS: localhost is not the
	// DNS server's answer; the hostname HELLO gave is in /etc/hosts).
	if out := v.sh(t, "nslookup probe.panda.test"); !strings.Contains(out, "192.0.2.7") {
		t.Errorf("nslookup probe.panda.test:\n%s", out)
	}
	for name, want := range map[string]string{"probe.panda.test": "192.0.2.7", "localhost": "127.0.0.1", "net": "127.0.1.1"} {
		// The address is printed before the (unanswered) ping.
		if out := v.sh(t, "ping -c 1 -W 1 "+name+" 2>&1 | head -n 1; true"); !strings.Contains(out, "("+want+")") {
			t.Errorf("ping %s resolved: %q, want %s", name, out, want)
		}
	}
}

// TestNetworkBase: names resolve in the Debian root filesystem (glibc,
// /etc/nsswitch.conf: /etc/hosts, then the DNS server at the gateway).
func TestNetworkBase(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	st, err := template.NewStore(template.Config{
		Dir: filepath.Join(shortDir(t), "templates"), RunDir: shortDir(t),
		Images: template.Images{Dir: testkit.Images()}, Driver: d, Accel: accel.TCG, TSCkHz: TSCkHz(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tp, err := st.Get(ctx, templates.Params{Name: "base", MemoryMiB: 512, VCPUs: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := newTestNet(t)
	n.serveDNS(t, map[string]string{"probe.panda.test": "192.0.2.7", "localhost": "192.0.2.99"})
	v := restoreTemplate(t, d, tp, files{tp.MemFile(), tp.StateFile(), tp.RootFS()}, n.nic())
	checkGuestNet(t, v, n)
	for cmd, want := range map[string]string{
		"getent ahostsv4 probe.panda.test | head -n 1": "192.0.2.7       STREAM probe.panda.test\n",
		"getent hosts localhost":                       "127.0.0.1       localhost\n",
		"getent hosts net":                             "127.0.1.1       net\n", // the hostname HELLO gave
		"python3 -c 'import socket; print(socket.gethostbyname(\"probe.panda.test\"))'": "192.0.2.7\n",
		"grep '^hosts:' /etc/nsswitch.conf":                                             "hosts:          files dns\n",
	} {
		if got := v.sh(t, cmd); got != want {
			t.Errorf("guest: %s: %q, want %q", cmd, got, want)
		}
	}
}

// TestNetworkForkAndRestore: a fork child (restored from a capture of a
// running machine) and a fresh restore of the template come up with the
// guest's IP and MAC, each on a TAP of its own, and the parent keeps its
// network through the capture.
func TestNetworkForkAndRestore(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	netA, netB, netC := newTestNet(t), newTestNet(t), newTestNet(t)
	a := restoreOn(t, d, templateFiles(t), netA.nic())
	checkGuestNet(t, a, netA)
	c := capture(t, a)
	child := restoreOn(t, d, c, netB.nic())
	fresh := restoreOn(t, d, templateFiles(t), netC.nic())
	for _, x := range []struct {
		name string
		v    *vm
		n    *testNet
	}{{"parent", a, netA}, {"fork child", child, netB}, {"restore", fresh, netC}} {
		t.Run(x.name, func(t *testing.T) { checkGuestNet(t, x.v, x.n) })
	}
	// Each is on its own TAP: the TAP the VMM holds is in the VMM's own
	// test network.
	for _, x := range []struct {
		v *vm
		n *testNet
	}{{a, netA}, {child, netB}, {fresh, netC}} {
		if got, want := tapNetns(t, x.v.m.PID()), nsInode(t, int(x.n.ns)); got != want {
			t.Errorf("vmm %d: its TAP is in network namespace %d, want %d (its own test network's)", x.v.m.PID(), got, want)
		}
	}
}

// tapNetns is the inode of the network namespace of the TAP that VMM pid
// holds (every TAP descriptor is /dev/net/tun: it is told apart by its
// device's namespace).
func tapNetns(t *testing.T, pid int) uint64 {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, tapFD, 0)
	if err != nil {
		t.Fatalf("get the TAP descriptor of vmm %d: %v", pid, err)
	}
	defer unix.Close(fd)
	nsfd, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS)
	if err != nil {
		t.Fatalf("vmm %d: descriptor %d is not a TAP: %v", pid, tapFD, err)
	}
	defer unix.Close(nsfd)
	return nsInode(t, nsfd)
}

func nsInode(t *testing.T, fd int) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestNICMismatch: a state saved with a NIC is not loaded into a machine
// without one (nor the reverse); a NIC without a proper TAP is refused
// before anything starts.
func TestNICMismatch(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	f := templateFiles(t)
	dir := shortDir(t)
	spec := tiny(t).Spec(template.Images{Dir: testkit.Images()})
	spec.RunDir = filepath.Join(dir, "run")
	spec.Disk = filepath.Join(dir, "disk")
	spec.MemoryFile = filepath.Join(dir, "mem")
	os.Mkdir(spec.RunDir, 0o755)
	testkit.CopySparse(t, f.disk, spec.Disk)
	if err := os.Link(f.mem, spec.MemoryFile); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	notTAP, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer notTAP.Close()
	tun := tunWithFlags(t, unix.IFF_TAP|unix.IFF_NO_PI) // no vnet header
	for _, c := range []struct {
		name string
		nic  *vmm.Net
		want string
	}{
		{"no TAP", &vmm.Net{MAC: guestnet.GuestMAC}, "has no TAP device"},
		{"not a TAP", &vmm.Net{TAP: notTAP, MAC: guestnet.GuestMAC}, "not a TAP device"},
		{"no vnet header", &vmm.Net{TAP: tun, MAC: guestnet.GuestMAC}, "want IFF_TAP|IFF_NO_PI|IFF_VNET_HDR"},
		{"bad MAC", &vmm.Net{TAP: newTestNet(t).tap, MAC: "01:00:5e:00:00:01"}, "not a unicast MAC"},
	} {
		s := spec
		s.Net = c.nic
		m, err := d.Start(ctx, s)
		if err == nil {
			m.Kill()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Start: %v, want an error with %q", c.name, err, c.want)
		}
	}

	spec.Net = nil
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	err = m.LoadState(ctx, f.state)
	if err == nil || !strings.Contains(err.Error(), "the saved machine has a network interface and this one has none") {
		t.Errorf("LoadState of a state with a NIC into a machine without: %v", err)
	}
	// Refused before loading: the VMM still waits for a state.
	select {
	case <-m.Done():
		t.Errorf("the vmm exited: %v", m.ExitError())
	default:
	}
}

// tunWithFlags opens a TAP device with flags in a namespace of its own.
func tunWithFlags(t *testing.T, flags uint16) *os.File {
	t.Helper()
	c := make(chan *os.File, 1)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, _ := netns.Get()
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			errc <- err
			return
		}
		ns.Close()
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err == nil {
			ifr, _ := unix.NewIfreq("tap0")
			ifr.SetUint16(flags)
			if err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				unix.Close(fd)
			}
		}
		if err := netns.Set(orig); err != nil {
			errc <- err
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			errc <- err
			return
		}
		c <- os.NewFile(uintptr(fd), "tun")
	}()
	select {
	case f := <-c:
		t.Cleanup(func() { f.Close() })
		return f
	case err := <-errc:
		t.Fatal(err)
		return nil
	}
}

func TestSavedNIC(t *testing.T) {
	name := "virtio-mmio@00000000feb02a00/virtio-net"
	section := append([]byte{4, 0, 0, 0, 9, byte(len(name))}, name...)
	for _, c := range []struct {
		state []byte
		want  bool
	}{
		{append([]byte("QEVM\x00\x00\x00\x03"), section...), true},
		{[]byte("QEVM\x00\x00\x00\x03\x27virtio-mmio@00000000feb02e00/virtio-blk"), false},
		{[]byte("virtio-mmio@00000000feb02a00/virtio-net"), false},     // no length before it
		{[]byte("\x10virtio-mmio@00000000feb02a00/virtio-net"), false}, // a length that does not end there
		{bytes.Repeat([]byte("virtio-mmio@"), 3), false},
		{nil, false},
	} {
		if got := savedNIC(c.state); got != c.want {
			t.Errorf("savedNIC(%q) = %v, want %v", c.state, got, c.want)
		}
	}
}

// BenchmarkNICCost measures what the NIC adds to a restore: from nothing
// to the answer of a first exec (for the NIC: an isolated namespace and
// TAP, then Start, LoadState, Resume, HELLO, exec of true), with a NIC
// (the tiny template) and without (the same guest baked without one
// here), alternately, b.N restores of each:
//
//	go test ./internal/hostagent/vmm/qemu -run '^$' -bench NICCost -benchtime 30x
func BenchmarkNICCost(b *testing.B) {
	t := b
	needVM(t)
	n := b.N
	d := newDriver(t, Config{})
	with := templateFiles(t)
	without := bakeWithoutNIC(t, d)
	dir := shortDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	times := map[string][]time.Duration{}
	var nsTimes []time.Duration
	for i := 0; i < n; i++ {
		for _, name := range []string{"with NIC", "without NIC"} {
			f := with
			if name == "without NIC" {
				f = without
			}
			spec := tiny(t).Spec(template.Images{Dir: testkit.Images()})
			spec.RunDir = filepath.Join(dir, "run")
			spec.Disk = filepath.Join(dir, "disk")
			spec.MemoryFile = filepath.Join(dir, "mem")
			os.RemoveAll(spec.RunDir)
			os.Remove(spec.Disk)
			os.Remove(spec.MemoryFile)
			os.Mkdir(spec.RunDir, 0o755)
			testkit.CopySparse(t, f.disk, spec.Disk)
			if err := os.Link(f.mem, spec.MemoryFile); err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			spec.Net = nil
			if name == "with NIC" {
				nic, err := guestnet.Isolated()
				if err != nil {
					b.Fatal(err)
				}
				nsTimes = append(nsTimes, time.Since(t0))
				spec.Net = nic
			}
			m, err := d.Start(ctx, spec)
			if spec.Net != nil {
				spec.Net.TAP.Close()
			}
			if err != nil {
				b.Fatal(err)
			}
			err = func() error {
				defer m.Kill()
				conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
				if err != nil {
					return err
				}
				c := guestproto.NewClient(conn)
				defer c.Close()
				if err := m.LoadState(ctx, f.state); err != nil {
					return err
				}
				if err := m.Resume(ctx); err != nil {
					return err
				}
				if _, err := c.Hello(ctx, guestproto.HelloRequest{}); err != nil {
					return err
				}
				if r, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || r.ExitCode != 0 {
					return fmt.Errorf("exec: %v %v", r, err)
				}
				times[name] = append(times[name], time.Since(t0))
				return nil
			}()
			if err != nil {
				b.Fatalf("%s: %v", name, err)
			}
		}
	}
	b.StopTimer()
	report := func(what string, ts []time.Duration) {
		t.Logf("%-26s %s", what, latencies(ts))
	}
	report("with NIC: first exec", times["with NIC"])
	report("without NIC: first exec", times["without NIC"])
	b.ReportMetric(ms(quantile(times["with NIC"], 0.5)), "with-nic-p50-ms")
	b.ReportMetric(ms(quantile(times["without NIC"], 0.5)), "without-nic-p50-ms")
	report("namespace + TAP (in it)", nsTimes)
}

// bakeWithoutNIC boots the tiny root filesystem without a NIC, as a bake
// does (shared RAM, agent answers, warm-up, barrier, pause, save), and
// returns the saved machine.
func bakeWithoutNIC(t testing.TB, d *Driver) files {
	t.Helper()
	tp := tiny(t)
	dir := shortDir(t)
	f := files{mem: filepath.Join(dir, "mem"), state: filepath.Join(dir, "state"), disk: filepath.Join(dir, "disk")}
	testkit.CopySparse(t, template.Images{Dir: testkit.Images()}.RootFS("tiny"), f.disk)
	if err := os.WriteFile(f.mem, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(f.mem, int64(tp.MemoryMiB)<<20); err != nil {
		t.Fatal(err)
	}
	spec := tp.Spec(template.Images{Dir: testkit.Images()})
	spec.Incoming, spec.MemoryShared, spec.Net = false, true, nil
	spec.Disk, spec.MemoryFile = f.disk, f.mem
	spec.RunDir = filepath.Join(dir, "run")
	spec.ConsoleLog = filepath.Join(dir, "console.log")
	os.Mkdir(spec.RunDir, 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	c := guestproto.NewClient(conn)
	defer c.Close()
	if _, err := c.Hello(ctx, guestproto.HelloRequest{Hostname: "panda-template"}); err != nil {
		t.Fatalf("boot without a NIC: %v", err)
	}
	for _, argv := range [][]string{{"true"}, {"/bin/sh", "-c", "true"}} {
		if _, err := c.Exec(ctx, guestproto.ExecRequest{Argv: argv}, nil, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.SaveState(ctx, f.state); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(spec.ConsoleLog); !bytes.Contains(b, []byte("no network interface")) {
		t.Errorf("a guest without a NIC did not say so on its console: %q", b)
	}
	return f
}

// TestGuestWithoutNIC: a guest booted without a NIC (which the drivers'
// users never do now) boots with loopback only and says so; its state is
// restored only onto a machine without a NIC.
func TestGuestWithoutNIC(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	f := bakeWithoutNIC(t, d)
	v := restoreOn(t, d, f, nil)
	if got := v.sh(t, "ls /sys/class/net"); got != "lo\n" {
		t.Errorf("interfaces of a guest without a NIC: %q, want lo only", got)
	}
	if got := v.sh(t, "cat /etc/resolv.conf"); got != "nameserver "+guestnet.DNS+"\n" {
		t.Errorf("resolv.conf: %q", got)
	}

	dir := shortDir(t)
	spec := tiny(t).Spec(template.Images{Dir: testkit.Images()})
	spec.RunDir = filepath.Join(dir, "run")
	spec.Disk = filepath.Join(dir, "disk")
	spec.MemoryFile = filepath.Join(dir, "mem")
	os.Mkdir(spec.RunDir, 0o755)
	testkit.CopySparse(t, f.disk, spec.Disk)
	if err := os.Link(f.mem, spec.MemoryFile); err != nil {
		t.Fatal(err)
	}
	spec = withNIC(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	if err := m.LoadState(ctx, f.state); err == nil || !strings.Contains(err.Error(), "the saved machine has no network interface and this one has one") {
		t.Errorf("LoadState of a state without a NIC into a machine with one: %v", err)
	}
}
