// Package qemu implements vmm.Driver with QEMU's microvm machine: one
// qemu-system-x86_64 process per machine, controlled over QMP, running
// confined (its own user; a mount namespace holding only its files, an
// empty network namespace and IPC and PID namespaces of its own; a cgroup
// and rlimits: see confine.go) and under QEMU's seccomp sandbox, with only a
// virtio-blk disk, a virtio-serial port for the guest agent and, if the spec
// has one, a virtio-net device on a TAP the caller opened. Device state
// is saved with xen-save-devices-state and loaded with migrate-incoming, both
// through file descriptors the driver passes (RAM stays in the memory file),
// so a restore never copies guest RAM.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/hostagent/internal/qmp"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"golang.org/x/sys/unix"
)

// Config configures the driver.
type Config struct {
	// Binary is the QEMU executable (default qemu-system-x86_64 on PATH).
	// Confined, it must live under /usr (or /lib, /bin, /sbin).
	Binary string
	// NoSandbox disables QEMU's seccomp sandbox (debugging only).
	NoSandbox bool
	// NoConfine runs QEMU as the driver's user, in the driver's
	// namespaces (mount, network, IPC, PID), with no cgroup and no
	// rlimits (debugging only).
	// Confinement needs root: New fails without it unless NoConfine.
	NoConfine bool
	// ExtraArgs are appended to every QEMU command line (debugging only,
	// e.g. "-d in_asm -D /run/tb.log"; confined, paths are those of the
	// jail, where /run is the machine's run directory).
	ExtraArgs []string

	// UIDBase and UIDCount are the range of user ids confined VMMs run
	// as, one per running machine (default 1,500,000,000 and 65,536: far
	// from ordinary users and from /etc/subuid ranges). Drivers of every
	// process that share HostDir and Cgroup must use the same range.
	UIDBase  uint32
	UIDCount int
	// GID is the primary group of machines whose Spec.GID is 0 (default
	// 1,499,999,999).
	GID uint32
	// MemoryOverheadMiB is what a machine may use beyond its guest RAM
	// (QEMU itself, the TCG translation cache) before its cgroup's memory
	// limit applies (default 256).
	MemoryOverheadMiB int
	// PidsMax bounds the tasks (threads) of one machine: its cgroup's
	// pids.max and its RLIMIT_NPROC (default 256).
	PidsMax int
	// Cgroup names the cgroup that holds one child per machine, created
	// under the driver's own cgroup in each hierarchy (default
	// "pandastack").
	Cgroup string
	// HostDir is a host directory the driver owns (default
	// /run/pandastack): it holds the lock that orders starts against
	// CleanupStale across processes, and an empty directory over which
	// each machine's jail is mounted, in the machine's own mount namespace
	// only.
	HostDir string

	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultUIDBase           = 1_500_000_000
	DefaultUIDCount          = 65536
	DefaultGID               = 1_499_999_999
	DefaultMemoryOverheadMiB = 256
	DefaultPidsMax           = 256
	DefaultCgroup            = "pandastack"
	DefaultHostDir           = "/run/pandastack"
)

// Driver starts QEMU microvm machines.
type Driver struct {
	cfg Config

	// Confinement (nil/empty with NoConfine).
	uids    *uidPool
	cgroups *cgroupSet
	root    []hostRoot
	devices []devNode
	ldCache bool
	jailDir string
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver. It starts nothing. Unless cfg.NoConfine it needs
// root, finds the cgroup hierarchies (v2, else v1) and creates the parent
// cgroup of the machines and cfg.HostDir.
func New(cfg Config) (*Driver, error) {
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	p, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("find qemu: %w (install the qemu-system-x86 package: make setup)", err)
	}
	if p, err = filepath.Abs(p); err != nil {
		return nil, fmt.Errorf("find qemu: %w", err)
	}
	cfg.Binary = p
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.UIDCount <= 0 {
		cfg.UIDCount = DefaultUIDCount
	}
	if cfg.GID == 0 {
		cfg.GID = DefaultGID
	}
	if cfg.MemoryOverheadMiB <= 0 {
		cfg.MemoryOverheadMiB = DefaultMemoryOverheadMiB
	}
	if cfg.PidsMax <= 0 {
		cfg.PidsMax = DefaultPidsMax
	}
	if cfg.Cgroup == "" {
		cfg.Cgroup = DefaultCgroup
	}
	if cfg.HostDir == "" {
		cfg.HostDir = DefaultHostDir
	}
	if err := noHugePages(); err != nil {
		return nil, err
	}
	d := &Driver{cfg: cfg}
	if cfg.NoConfine {
		return d, nil
	}
	if err := d.setupConfinement(); err != nil {
		return nil, fmt.Errorf("confine vmms: %w", err)
	}
	return d, nil
}

func (d *Driver) setupConfinement() error {
	cfg := d.cfg
	if os.Geteuid() != 0 {
		return errors.New("confining vmms needs root (run the host agent as root; NoConfine is for debugging only)")
	}
	if uint64(cfg.UIDBase)+uint64(cfg.UIDCount) > 1<<31 || cfg.UIDBase < 65536 {
		return fmt.Errorf("vmm user ids %d+%d are out of range", cfg.UIDBase, cfg.UIDCount)
	}
	if strings.ContainsAny(cfg.Cgroup, "/.") {
		return fmt.Errorf("cgroup name %q must be a plain name", cfg.Cgroup)
	}
	real, err := filepath.EvalSymlinks(cfg.Binary)
	if err != nil {
		return err
	}
	if d.root, err = hostLayout(real); err != nil {
		return err
	}
	if d.devices, err = hostDevices(); err != nil {
		return err
	}
	_, err = os.Stat("/etc/ld.so.cache")
	d.ldCache = err == nil
	d.jailDir = filepath.Join(cfg.HostDir, "jail")
	if err := os.MkdirAll(d.jailDir, 0o700); err != nil {
		return err
	}
	if d.cgroups, err = detectCgroups(cfg.Cgroup); err != nil {
		return err
	}
	d.uids = newUIDPool(cfg.UIDBase, cfg.UIDCount)
	return nil
}

// Confined reports whether the driver confines its VMMs.
func (d *Driver) Confined() bool { return !d.cfg.NoConfine }

// CgroupVersion is 2 or 1 for the cgroup hierarchy the driver confines
// VMMs with, 0 if it does not confine them.
func (d *Driver) CgroupVersion() int {
	switch {
	case d.cgroups == nil:
		return 0
	case d.cgroups.v2:
		return 2
	default:
		return 1
	}
}

// Leftovers is what CleanupStale found (see vmm.Leftovers).
type Leftovers = vmm.Leftovers

// Orphan is a process in a machine cgroup that the driver does not own
// (see vmm.Orphan).
type Orphan = vmm.Orphan

// CleanupStale removes what confined machines that are gone left behind:
// their cgroups (a host agent that crashed never removed them), which also
// frees their UIDs. It never touches a machine this driver started or
// adopted, nor a start in progress in any process sharing HostDir and
// Cgroup (it waits for those to place their process). Call it at start-up
// after re-adopting the running VMMs (Adopt), so that it can tell adopted
// VMMs from orphans. Safe to call at any time and concurrently with Start.
func (d *Driver) CleanupStale() (Leftovers, error) {
	var out Leftovers
	if d.cfg.NoConfine {
		return out, nil
	}
	lock, err := d.lockFile(unix.LOCK_EX)
	if err != nil {
		return out, err
	}
	defer lock.Close()
	var errs []error
	for uid := range d.cgroups.existing() {
		if d.uids.inUse(uid) {
			continue
		}
		c := d.cgroups.of(uid)
		if pids := c.pids(); len(pids) > 0 {
			for _, pid := range pids {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				out.Orphans = append(out.Orphans, Orphan{PID: pid, RunDir: runDirOf(cmdline)})
			}
			continue
		}
		if err := c.remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		out.Removed = append(out.Removed, c.dirs...)
	}
	return out, errors.Join(errs...)
}

const defaultTBCacheMiB = 64

// The descriptors of the listening agent and QMP sockets and of the TAP
// device in QEMU (exec.Cmd.ExtraFiles start at 3).
const (
	agentFD = 3
	qmpFD   = 4
	tapFD   = 5
)

// paths are the paths of a machine's files as its QEMU sees them: the
// host's, or the jail's.
type paths struct {
	disk, mem, kernel, initrd, console string
}

func hostPaths(spec vmm.Spec) paths {
	return paths{spec.Disk, spec.MemoryFile, spec.Kernel, spec.Initramfs, spec.ConsoleLog}
}

func jailPaths(spec vmm.Spec) paths {
	p := paths{jailDisk, jailMem, jailKernel, jailInitrd, ""}
	if spec.ConsoleLog != "" {
		p.console = jailConsole
	}
	return p
}

// nameArg is the -name of the machine whose host run directory is runDir:
// it identifies the process for Adopt, whatever paths it sees.
func nameArg(runDir string) string {
	return "guest=panda:" + qemuEscape(runDir) + ",debug-threads=on"
}

// args builds the QEMU command line for spec, with its files at p.
func (d *Driver) args(spec vmm.Spec, p paths) ([]string, error) {
	if spec.MemoryMiB <= 0 {
		return nil, fmt.Errorf("memory must be positive, got %d MiB", spec.MemoryMiB)
	}
	if spec.VCPUs <= 0 {
		spec.VCPUs = 1
	}
	accelArg := ""
	switch spec.Accel {
	case accel.KVM:
		accelArg = "kvm"
	case accel.TCG:
		tb := spec.TBCacheMiB
		if tb <= 0 {
			tb = defaultTBCacheMiB
		}
		accelArg = fmt.Sprintf("tcg,thread=multi,tb-size=%d", tb)
	default:
		return nil, fmt.Errorf("accel %q must be resolved to kvm or tcg before start", spec.Accel)
	}
	share := "off"
	if spec.MemoryShared {
		share = "on"
	}
	prealloc := "off"
	if spec.Prealloc {
		prealloc = "on"
	}
	pit := "on"
	switch spec.Machine {
	case vmm.MachineLegacy:
	case vmm.MachineNoPIT:
		pit = "off"
	default:
		return nil, fmt.Errorf("unknown machine layout %q (made by a newer PandaStack?)", spec.Machine)
	}
	console := "null"
	if p.console != "" {
		console = "file:" + p.console
	}
	a := []string{
		"-name", nameArg(spec.RunDir),
		// mem-merge=off and merge=off: no KSM on guest RAM (pages merged
		// across guests leak through timing and cost a scan).
		"-machine", "microvm,acpi=on,pit=" + pit + ",pic=on,rtc=on,isa-serial=on,memory-backend=mem,mem-merge=off",
		"-accel", accelArg,
		"-cpu", cpuModel(spec.Accel),
		"-m", fmt.Sprintf("%dM", spec.MemoryMiB),
		"-smp", strconv.Itoa(spec.VCPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s,prealloc=%s,discard-data=off,merge=off",
			spec.MemoryMiB, qemuEscape(p.mem), share, prealloc),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", console,
		"-drive", fmt.Sprintf("id=vda,file=%s,format=raw,if=none,cache=writeback,discard=unmap,detect-zeroes=unmap", qemuEscape(p.disk)),
		"-device", "virtio-blk-device,drive=vda",
		"-device", "virtio-serial-device,max_ports=2",
		// Both sockets are the host's, bound in the run directory before
		// the start and passed as listening descriptors: QEMU never needs
		// to create a file.
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", agentFD),
		"-device", "virtserialport,chardev=agent,name=panda",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", qmpFD),
		"-mon", "chardev=qmp,mode=control",
		"-global", "migration.send-configuration=off",
		// No self-announce after an incoming migration: QEMU would have
		// the guest send gratuitous ARPs (virtio-net's guest announce)
		// several times over ~1 s after every restore — guest work right
		// when the first command runs (~900 translation blocks under
		// TCG). A sandbox's TAP is its own: no switch has to relearn
		// where its MAC address lives.
		"-global", "migration.announce-rounds=0",
	}
	if spec.Net != nil {
		mac, err := parseMAC(spec.Net.MAC)
		if err != nil {
			return nil, err
		}
		// The TAP is the caller's, passed as a descriptor: QEMU runs no
		// script and needs no privilege. No vhost: it would need
		// /dev/vhost-net in the jail and works only under KVM.
		a = append(a,
			"-netdev", fmt.Sprintf("tap,id=net0,fd=%d,vhost=off", tapFD),
			"-device", "virtio-net-device,netdev=net0,mac="+mac.String())
	}
	if !d.cfg.NoSandbox {
		a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	}
	if spec.Incoming {
		// A restore never runs the firmware or the kernel loader: guest
		// RAM comes from the memory file. Not loading 20 MB of kernel and
		// initramfs into fw_cfg saves ~20 ms of every start.
		a = append(a, "-incoming", "defer", "-S")
	} else {
		a = append(a, "-kernel", p.kernel, "-initrd", p.initrd, "-append", spec.Cmdline)
	}
	return append(a, d.cfg.ExtraArgs...), nil
}

// parseMAC parses the MAC address of a guest's NIC: six bytes, unicast.
func parseMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return nil, fmt.Errorf("network interface: %q is not a unicast MAC address", s)
	}
	return mac, nil
}

// checkTAP checks that f is a TAP device as vmm.Net requires:
// IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, one queue. The virtio-net device state
// depends on the vnet header: a machine saved on one TAP must be loadable
// on another, so every TAP must be alike.
func checkTAP(f *os.File) error {
	if f == nil {
		return errors.New("network interface has no TAP device")
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("network interface: %w", err)
	}
	var ioErr error
	if err := sc.Control(func(fd uintptr) { ioErr = unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr) }); err != nil {
		return fmt.Errorf("network interface: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("network interface: not a TAP device: %w", ioErr)
	}
	flags := ifr.Uint16()
	const want = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
	if flags&(unix.IFF_TUN|unix.IFF_TAP) != unix.IFF_TAP || flags&want != want || flags&unix.IFF_MULTI_QUEUE != 0 {
		return fmt.Errorf("network interface: TAP device %s has flags %#x, want IFF_TAP|IFF_NO_PI|IFF_VNET_HDR and one queue", ifr.Name(), flags)
	}
	return nil
}

func cpuModel(a accel.Accel) string {
	if a == accel.KVM {
		return "host"
	}
	return "max"
}

// qemuEscape doubles commas, QEMU's option-value escape.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func agentSocket(runDir string) string { return filepath.Join(runDir, "agent.sock") }
func qmpSocket(runDir string) string   { return filepath.Join(runDir, "qmp.sock") }

// PIDFile is where Start records the VMM's PID inside the run directory, so
// that a restarted host agent can find and adopt it.
func PIDFile(runDir string) string { return filepath.Join(runDir, "vmm.pid") }

// limits are the cgroup limits of a machine of memMiB and vcpus.
func (d *Driver) limits(memMiB, vcpus int) cgroupLimits {
	if vcpus <= 0 {
		vcpus = 1
	}
	return cgroupLimits{
		cpuQuotaUs: int64(vcpus) * cpuPeriodUs,
		memBytes:   int64(memMiB+d.cfg.MemoryOverheadMiB) << 20,
		pids:       d.cfg.PidsMax,
	}
}

// jailFiles are the binds of spec's files into its jail.
func jailFiles(spec vmm.Spec) []jailFile {
	f := []jailFile{
		{host: spec.Disk, jail: jailDisk, rw: true},
		// Read-write although the mapping is private (share=off): QEMU
		// 7.2's memory-backend-file opens mem-path O_RDWR whatever share
		// is, and its readonly=on maps guest RAM read-only (unusable as
		// RAM). QEMU >= 8.2 has readonly=on,rom=off (an O_RDONLY open,
		// a private writable mapping), which would allow a read-only bind
		// and mode 0640.
		{host: spec.MemoryFile, jail: jailMem, rw: true},
	}
	if spec.ConsoleLog != "" {
		f = append(f, jailFile{host: spec.ConsoleLog, jail: jailConsole, rw: true})
	}
	if !spec.Incoming {
		f = append(f, jailFile{host: spec.Kernel, jail: jailKernel}, jailFile{host: spec.Initramfs, jail: jailInitrd})
	}
	return f
}

// giveFiles makes spec's files accessible to uid:gid and to nobody else
// but root, as vmm.Driver.Start documents: a machine owns its disk and
// console log; its memory file, which machines of one GID may share, is
// open to that group (read-write: see jailFiles). The run directory stays
// root's (0700): QEMU only gets the sockets in it, as descriptors.
func giveFiles(spec vmm.Spec, uid, gid int) error {
	own := func(path string, mode os.FileMode) error {
		if err := os.Chown(path, uid, gid); err != nil {
			return fmt.Errorf("give %s to the vmm user: %w", filepath.Base(path), err)
		}
		return os.Chmod(path, mode)
	}
	if err := own(spec.Disk, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(spec.RunDir, 0o700); err != nil {
		return err
	}
	if spec.ConsoleLog != "" {
		f, err := os.OpenFile(spec.ConsoleLog, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return fmt.Errorf("create console log: %w", err)
		}
		f.Close()
		if err := own(spec.ConsoleLog, 0o600); err != nil {
			return err
		}
	}
	if err := os.Chown(spec.MemoryFile, -1, gid); err != nil {
		return fmt.Errorf("give memory file to the vmm group: %w", err)
	}
	return os.Chmod(spec.MemoryFile, 0o660)
}

// fileID identifies a file by device and inode.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
}

// Start implements vmm.Driver.
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if len(agentSocket(spec.RunDir)) > 100 {
		return nil, fmt.Errorf("run directory %s is too long for a unix socket path", spec.RunDir)
	}
	files := []struct{ what, path string }{{"memory file", spec.MemoryFile}, {"disk", spec.Disk}}
	if !spec.Incoming {
		files = append(files, struct{ what, path string }{"kernel", spec.Kernel}, struct{ what, path string }{"initramfs", spec.Initramfs})
	}
	if spec.Net != nil {
		if err := checkTAP(spec.Net.TAP); err != nil {
			return nil, fmt.Errorf("start vm: %w", err)
		}
	}
	var fsize int64
	for _, f := range files {
		st, err := os.Stat(f.path)
		if err != nil {
			return nil, fmt.Errorf("start vm: %s: %w", f.what, err)
		}
		fsize = max(fsize, st.Size())
	}
	if st, err := os.Stat(spec.RunDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("start vm: run directory %s missing: %v", spec.RunDir, err)
	}
	memID, err := statID(spec.MemoryFile)
	if err != nil {
		return nil, fmt.Errorf("start vm: memory file: %w", err)
	}
	p := hostPaths(spec)
	if !d.cfg.NoConfine {
		p = jailPaths(spec)
	}
	args, err := d.args(spec, p)
	if err != nil {
		return nil, fmt.Errorf("start vm: %w", err)
	}
	removeSockets := func() {
		os.Remove(agentSocket(spec.RunDir))
		os.Remove(qmpSocket(spec.RunDir))
	}
	removeSockets()
	var socks []*os.File
	defer func() {
		for _, f := range socks {
			f.Close() // QEMU has its own copies
		}
	}()
	for _, path := range []string{agentSocket(spec.RunDir), qmpSocket(spec.RunDir)} {
		f, err := listenUnix(path)
		if err != nil {
			removeSockets()
			return nil, fmt.Errorf("start vm: %w", err)
		}
		socks = append(socks, f)
	}
	cmd := exec.Command(d.cfg.Binary, args...)
	cmd.Dir = spec.RunDir
	cmd.ExtraFiles = slices.Clone(socks) // agentFD, qmpFD
	if spec.Net != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, spec.Net.TAP) // tapFD; the caller's to close
	}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 16 << 10}
	t0 := time.Now()
	b, err := d.spawn(cmd, confinement{
		gid:    spec.GID,
		limits: d.limits(spec.MemoryMiB, spec.VCPUs),
		files:  jailFiles(spec),
		kvm:    spec.Accel == accel.KVM,
		prepare: func(uid, gid int) error {
			return giveFiles(spec, uid, gid)
		},
		// The disk and the memory file are written within their sizes;
		// the console log (a bake's) may grow to as much.
		fsize: fsize,
	})
	if err != nil {
		removeSockets()
		return nil, fmt.Errorf("start vm: %w", err)
	}
	m := newMachine(spec, cmd.Process.Pid, d.cfg.Logger)
	m.stderr = &stderr
	m.box = b
	if b != nil {
		m.uid = b.uid
	}
	// spawn_ms: confinement (UID, cgroup, files, jail, rlimits) and exec.
	d.cfg.Logger.Debug("vmm process started", "pid", m.pid, "uid", m.uid, "spawn_ms", float64(time.Since(t0).Microseconds())/1000)
	m.memID = memID
	go func() {
		err := cmd.Wait()
		m.exited(err)
	}()
	if err := os.WriteFile(PIDFile(spec.RunDir), []byte(strconv.Itoa(m.pid)), 0o644); err != nil {
		m.Kill()
		return nil, fmt.Errorf("write pid file: %w", err)
	}
	if err := m.connect(ctx); err != nil {
		m.Kill()
		return nil, err
	}
	return m, nil
}

// listenUnix binds and listens on a unix socket at path and returns the
// listening socket.
func listenUnix(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", path, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// isVMMOf reports whether cmdline (NUL-separated, from /proc/PID/cmdline)
// is that of the QEMU serving runDir: its -name says so (or, for a VMM
// started before -name did, its QMP socket is runDir's).
func isVMMOf(cmdline []byte, runDir string) bool {
	if runDirOf(cmdline) == runDir {
		return true
	}
	return bytes.Contains(cmdline, []byte("unix:"+qemuEscape(qmpSocket(runDir))+","))
}

// procUID is the real UID of process pid.
func procUID(pid int) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				v, err := strconv.ParseUint(f[0], 10, 32)
				return uint32(v), err
			}
		}
	}
	return 0, fmt.Errorf("no Uid in /proc/%d/status", pid)
}

// Processes lists the live QEMU processes (of this driver's binary) whose
// command line names a directory in runDir, mapping each pid to that
// directory's name: the VMMs of runDir's machines, whether or not their
// PID was recorded (a crash between starting a VMM and writing its PID
// file leaves one only this finds).
func (d *Driver) Processes(runDir string) map[int]string {
	out := map[int]string{}
	prefix := filepath.Clean(runDir) + "/"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 { // gone, or a zombie
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(argv[0]) != filepath.Base(d.cfg.Binary) {
			continue
		}
		// Its -name names its run directory; a VMM started before -name
		// did names it in its socket paths.
		if dir := runDirOf(b); dir != "" {
			if filepath.Dir(dir)+"/" == prefix {
				out[pid] = filepath.Base(dir)
			}
			continue
		}
		for _, a := range argv[1:] {
			// A path under runDir (a socket, RUN/NAME/qmp.sock) or the
			// directory itself in an option list (RUN/NAME,opt=...).
			if _, rest, ok := strings.Cut(a, prefix); ok {
				if name := rest[:strings.IndexAny(rest+"/", "/,")]; name != "" {
					out[pid] = name
					break
				}
			}
		}
	}
	return out
}

// Adopt takes over a VMM process started by an earlier host agent, found by
// the PID file in spec.RunDir. It fails if the process is gone or is not the
// QEMU that serves spec.RunDir. The UID the process runs as is taken (Start
// will not hand it out) until the process exits; its cgroup is removed then.
func (d *Driver) Adopt(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	b, err := os.ReadFile(PIDFile(spec.RunDir))
	if err != nil {
		return nil, fmt.Errorf("adopt vm: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return nil, fmt.Errorf("adopt vm: bad pid file %q", b)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt vm: process %d: %w", pid, vmm.ErrExited)
	}
	// Checked after the pidfd is open: the pidfd then refers to the
	// process checked, not to one that took its PID later.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt vm: process %d: %w", pid, vmm.ErrExited)
	}
	if !isVMMOf(cmdline, spec.RunDir) {
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt vm: process %d is not the vmm of %s: %w", pid, spec.RunDir, vmm.ErrExited)
	}
	uid, err := procUID(pid)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt vm: process %d: %w", pid, vmm.ErrExited)
	}
	memID, err := statID(spec.MemoryFile)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("adopt vm: memory file: %w", err)
	}
	m := newMachine(spec, pid, d.cfg.Logger)
	m.memID = memID
	if d.uids != nil && d.uids.markUsed(uid) {
		m.box = &box{d: d, uid: uid, gid: spec.GID}
		// Its own cgroup, wherever the driver that started it had its
		// parents (a restarted host agent may sit in another cgroup).
		if c, err := d.cgroups.cgroupOf(pid); err == nil && c.named(uid) {
			m.box.cg = c
		}
	} else if uid != 0 && d.uids != nil {
		d.cfg.Logger.Warn("adopted vmm runs as a user outside the driver's range, or one already in use", "pid", pid, "uid", uid)
	}
	m.uid = uid
	go func() {
		// Not our child: wait for exit through the pidfd.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		unix.Close(pidfd)
		m.exited(errors.New("adopted vmm exited"))
	}()
	if err := m.connect(ctx); err != nil {
		m.Kill()
		return nil, err
	}
	return m, nil
}

// runDirOf is the host run directory named in a VMM's command line
// (see nameArg), or "".
func runDirOf(cmdline []byte) string {
	args := strings.Split(string(cmdline), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-name" {
			continue
		}
		v, ok := strings.CutPrefix(args[i+1], "guest=panda:")
		if v, ok2 := strings.CutSuffix(v, ",debug-threads=on"); ok && ok2 {
			return strings.ReplaceAll(v, ",,", ",")
		}
	}
	return ""
}

// Machine is a QEMU process.
type Machine struct {
	spec   vmm.Spec
	pid    int
	uid    uint32
	box    *box   // confinement to release at exit; nil if unconfined
	memID  fileID // spec.MemoryFile as it was at start
	log    *slog.Logger
	stderr *bytes.Buffer

	qmpMu    sync.Mutex
	qmp      *qmp.Client // dialled again by client if it closes
	released bool

	done     chan struct{}
	exitOnce sync.Once
	exitErr  error
	killed   bool
	killMu   sync.Mutex
}

var _ vmm.Machine = (*Machine)(nil)

func newMachine(spec vmm.Spec, pid int, log *slog.Logger) *Machine {
	return &Machine{spec: spec, pid: pid, log: log, done: make(chan struct{})}
}

func (m *Machine) exited(err error) {
	m.exitOnce.Do(func() {
		// The process is gone: its cgroup can go, and its UID with it,
		// before anyone waiting on Done learns that it exited.
		if m.box != nil {
			if err := m.box.release(); err != nil {
				m.log.Warn("cannot remove the cgroup of an exited vmm; CleanupStale will", "pid", m.pid, "err", err)
			}
		}
		m.killMu.Lock()
		if !m.killed {
			msg := ""
			if m.stderr != nil {
				msg = cleanStderr(m.stderr.String())
			}
			if msg != "" {
				err = fmt.Errorf("%v: %s", err, msg)
			}
			if err == nil {
				err = errors.New("vmm exited")
			}
			m.exitErr = err
		}
		m.killMu.Unlock()
		close(m.done)
	})
}

// connect opens QMP, bounded by DefaultStartTimeout and ctx, and fails fast
// if the process dies first.
func (m *Machine) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, vmm.DefaultStartTimeout)
	defer cancel()
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := qmp.Dial(ctx, qmpSocket(m.spec.RunDir))
	if err != nil {
		select {
		case <-m.done:
			return fmt.Errorf("qemu exited during start: %w", m.ExitError())
		default:
		}
		return fmt.Errorf("connect to qemu: %w", err)
	}
	m.qmp = c
	return nil
}

// PID implements vmm.Machine.
func (m *Machine) PID() int { return m.pid }

// UID is the user the VMM process runs as: its own, from the driver's
// range, when confined; 0 when the driver does not confine VMMs (or for
// an adopted VMM that an unconfined driver started).
func (m *Machine) UID() int { return int(m.uid) }

// AgentSocket implements vmm.Machine.
func (m *Machine) AgentSocket() string { return agentSocket(m.spec.RunDir) }

// Done implements vmm.Machine.
func (m *Machine) Done() <-chan struct{} { return m.done }

// ExitError implements vmm.Machine.
func (m *Machine) ExitError() error {
	select {
	case <-m.done:
		return m.exitErr
	default:
		return nil
	}
}

func (m *Machine) exec(ctx context.Context, cmd string, args, out any) error {
	return m.execWithFDs(ctx, cmd, args, out, nil)
}

// client is the machine's QMP connection, dialled again if the last one
// closed while the process lives on. A command whose ctx ends before its
// reply closes its connection (a late reply would answer the next
// command), and the machine must still obey the next caller: above all
// the one that continues a machine whose capture was cancelled while its
// vCPUs were stopped.
func (m *Machine) client(ctx context.Context) (*qmp.Client, error) {
	m.qmpMu.Lock()
	defer m.qmpMu.Unlock()
	if m.released {
		return nil, errors.New("qmp: the machine was released to another process")
	}
	if !m.qmp.Closed() {
		return m.qmp, nil
	}
	select {
	case <-m.done:
		return nil, vmm.ErrExited
	default:
	}
	m.log.Info("reconnecting to the vmm's control socket", "pid", m.pid)
	if err := m.connect(ctx); err != nil {
		return nil, err
	}
	return m.qmp, nil
}

func (m *Machine) execWithFDs(ctx context.Context, cmd string, args, out any, fds []int) error {
	select {
	case <-m.done:
		return fmt.Errorf("%s: %w", cmd, vmm.ErrExited)
	default:
	}
	c, err := m.client(ctx)
	if err == nil {
		err = c.ExecuteWithFDs(ctx, cmd, args, out, fds)
	}
	if err != nil {
		select {
		case <-m.done:
			return fmt.Errorf("%s: %w", cmd, vmm.ErrExited)
		default:
		}
	}
	return err
}

// LoadState implements vmm.Machine. A state whose device layout differs
// from the machine's makes QEMU exit ("qmp connection closed"); the one
// difference the vmm contract allows a caller to get wrong, a network
// interface on one side only, is caught before loading.
func (m *Machine) LoadState(ctx context.Context, statePath string) error {
	f, err := os.Open(statePath)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	defer f.Close()
	saved, err := io.ReadAll(io.NewSectionReader(f, 0, maxStateSize))
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	switch has := savedNIC(saved); {
	case has && m.spec.Net == nil:
		return errors.New("load state: the saved machine has a network interface and this one has none (vmm.Spec.Net)")
	case !has && m.spec.Net != nil:
		return errors.New("load state: the saved machine has no network interface and this one has one (vmm.Spec.Net)")
	}
	if err := m.execWithFDs(ctx, "getfd", map[string]string{"fdname": "state"}, nil, []int{int(f.Fd())}); err != nil {
		return fmt.Errorf("load state: pass fd: %w", err)
	}
	if err := m.exec(ctx, "migrate-incoming", map[string]string{"uri": "fd:state"}, nil); err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	// The state is a few KiB: poll rather than wait for events.
	for delay := 200 * time.Microsecond; ; {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.exec(ctx, "query-migrate", nil, &st); err != nil {
			return fmt.Errorf("load state: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("load state %s: migration %s: %s", statePath, st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("load state: %w", ctx.Err())
		case <-time.After(delay):
		}
		if delay < 5*time.Millisecond {
			delay *= 2
		}
	}
}

// maxStateSize bounds what LoadState reads of a device state to look for a
// network interface: states are a few tens of KiB.
const maxStateSize = 4 << 20

// savedNIC reports whether a device state saved by SaveState holds a
// virtio-net device: a section named "virtio-mmio@ADDRESS/virtio-net",
// which the stream writes after the length of the name. (A guest can put
// bytes of its choosing into some device state, e.g. CMOS RAM; at worst it
// makes its own captures unloadable.)
func savedNIC(state []byte) bool {
	prefix := []byte("virtio-mmio@")
	for off := 0; ; {
		i := bytes.Index(state[off:], prefix)
		if i < 0 {
			return false
		}
		i += off
		if i > 0 {
			if n := int(state[i-1]); i+n <= len(state) && bytes.HasSuffix(state[i:i+n], []byte("/virtio-net")) {
				return true
			}
		}
		off = i + len(prefix)
	}
}

// Pause implements vmm.Machine.
func (m *Machine) Pause(ctx context.Context) error {
	if err := m.exec(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return nil
}

// Resume implements vmm.Machine.
func (m *Machine) Resume(ctx context.Context) error {
	if err := m.exec(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// SaveState implements vmm.Machine. The machine must be paused. The
// driver creates path (mode 0600) and passes it to QEMU as a file
// descriptor (QMP add-fd, written as /dev/fdset/N): a confined QEMU cannot
// see the host's paths.
func (m *Machine) SaveState(ctx context.Context, path string) error {
	var st struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := m.exec(ctx, "query-status", nil, &st); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if st.Running {
		return fmt.Errorf("save state: machine is %s, want paused", st.Status)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer f.Close()
	var fdset struct {
		ID int `json:"fdset-id"`
	}
	if err := m.execWithFDs(ctx, "add-fd", map[string]any{"opaque": "save-state"}, &fdset, []int{int(f.Fd())}); err != nil {
		return fmt.Errorf("save state: pass fd: %w", err)
	}
	// live=false keeps the block devices active in this process (live=true
	// would hand them over to a migration target and leave us without disks).
	err = m.exec(ctx, "xen-save-devices-state", map[string]any{"filename": fmt.Sprintf("/dev/fdset/%d", fdset.ID), "live": false}, nil)
	// QEMU closed its duplicate; drop the set's own copy.
	if rerr := m.exec(ctx, "remove-fd", map[string]any{"fdset-id": fdset.ID}, nil); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// RAMMapping implements vmm.Machine by finding the mapping of the memory
// file in /proc/PID/maps by device and inode (a confined QEMU maps it from
// a path of its own jail), offset 0 and the guest's RAM size.
func (m *Machine) RAMMapping() (vmm.RAMMapping, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", m.pid))
	if err != nil {
		return vmm.RAMMapping{}, fmt.Errorf("read maps: %w", err)
	}
	want := uint64(m.spec.MemoryMiB) << 20
	for _, line := range strings.Split(string(b), "\n") {
		// start-end perms offset dev inode path
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != strconv.FormatUint(m.memID.ino, 10) {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(f[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || off != 0 || end-start != want {
			continue
		}
		// maps shows the device of the file's superblock, which is not
		// always st_dev (btrfs subvolumes): stat the mapping itself.
		id, err := statID(fmt.Sprintf("/proc/%d/map_files/%s", m.pid, f[0]))
		if err != nil || id != m.memID {
			continue
		}
		return vmm.RAMMapping{PID: m.pid, Start: start, Size: want}, nil
	}
	return vmm.RAMMapping{}, fmt.Errorf("no %d MiB mapping of %s in process %d", m.spec.MemoryMiB, m.spec.MemoryFile, m.pid)
}

// Kill implements vmm.Machine.
func (m *Machine) Kill() error {
	m.killMu.Lock()
	select {
	case <-m.done:
		m.killMu.Unlock()
	default:
		m.killed = true
		m.killMu.Unlock()
		// quit is orderly but a stuck QEMU may not answer: SIGKILL is what
		// guarantees the process is gone, and a sandbox has nothing to flush
		// that its owner expects to keep once it is killed.
		unix.Kill(m.pid, unix.SIGKILL)
		<-m.done
	}
	m.closeQMP()
	os.Remove(agentSocket(m.spec.RunDir))
	os.Remove(qmpSocket(m.spec.RunDir))
	os.Remove(PIDFile(m.spec.RunDir))
	return nil
}

// Release closes the connection to the VMM's control socket without
// stopping the VMM, so that another process (a restarted host agent) can
// adopt it: QEMU serves one QMP client at a time. The Machine must not be
// used afterwards.
func (m *Machine) Release() {
	m.qmpMu.Lock()
	m.released = true
	m.qmpMu.Unlock()
	m.closeQMP()
}

func (m *Machine) closeQMP() {
	m.qmpMu.Lock()
	defer m.qmpMu.Unlock()
	if m.qmp != nil {
		m.qmp.Close()
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := l.max - l.buf.Len(); room > 0 {
		if len(p) > room {
			l.buf.Write(p[:room])
		} else {
			l.buf.Write(p)
		}
	}
	return len(p), nil
}

// HMP runs a human monitor command (for diagnostics, e.g. "info jit").
func (m *Machine) HMP(ctx context.Context, cmd string) (string, error) {
	var out string
	err := m.exec(ctx, "human-monitor-command", map[string]string{"command-line": cmd}, &out)
	return out, err
}

// cleanStderr drops QEMU's harmless warnings from its stderr.
func cleanStderr(s string) string {
	var keep []string
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.Contains(line, "Expected vmdescription section") {
			continue
		}
		keep = append(keep, line)
	}
	return strings.Join(keep, "; ")
}
