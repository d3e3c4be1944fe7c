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
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

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
