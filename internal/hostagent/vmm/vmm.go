// Package vmm defines the contract between the host agent and a virtual
// machine monitor: start a machine (cold boot or waiting for saved state),
// pause, save and load device state, resume, and stop. Guest RAM always lives
// in a file (Spec.MemoryFile) so that a snapshot is that file plus the small
// device state written by SaveState. Implementations live in subpackages
// (vmm/qemu); they import this package, never the reverse.
package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// Spec describes one machine. The same Spec (except the fields that name
// per-machine files, MemoryShared, Incoming and Net.TAP) must be used to
// restore a state that was saved from it: device layout (Net included),
// memory size and vCPU count are part of the saved state.
type Spec struct {
	Kernel    string // path of the guest kernel (bzImage)
	Initramfs string // path of the initramfs
	Cmdline   string // kernel command line
	MemoryMiB int
	VCPUs     int
	Accel     accel.Accel // must be kvm or tcg (resolve auto before Start)

	// MemoryFile backs guest RAM. With MemoryShared the guest writes
	// through to the file (used when baking a template); otherwise the file
	// is mapped copy-on-write (MAP_PRIVATE) and never modified.
	MemoryFile   string
	MemoryShared bool
	// Prealloc copies every page of MemoryFile into the machine at start
	// (a full private copy of RAM). Only benchmarks use it, as the naive
	// baseline of copy-on-write sharing.
	Prealloc bool

	// Disk is the root filesystem image, attached as the first virtio-blk
	// device (/dev/vda). The machine opens it read-write.
	Disk string

	// RunDir holds the machine's sockets and console log; it must exist and
	// be short enough for unix socket paths (< 100 bytes).
	RunDir string
	// ConsoleLog, when set, receives the guest serial console. Empty
	// discards it.
	ConsoleLog string

	// Incoming starts the machine paused, waiting for LoadState instead of
	// booting the kernel.
	Incoming bool

	// TBCacheMiB bounds the TCG translation cache (0: driver default).
	TBCacheMiB int

	// Machine is the machine's device layout (MachineLegacy,
	// MachineNoPIT). A saved state loads only into a machine of the same
	// layout, so templates and snapshots record the layout they were made
	// with and every restore of them gives it back; new machines take
	// MachineCurrent.
	Machine string `json:"machine,omitempty"`

	// GID is the primary group of a confined VMM process (0: the driver's
	// default group). Machines that map the same MemoryFile must run with
	// the same GID, since the driver gives that file to this group (see
	// Driver.Start). Give each tenant its own GID, so that a memory file
	// is open to the VMMs of one tenant only.
	GID uint32

	// Net, if set, gives the machine one network interface (a virtio-net
	// device, eth0 in the guest). It is part of the device layout: a state
	// saved from a machine with a NIC must be loaded into a machine with a
	// NIC with the same MAC, and a state saved without one into a machine
	// without one; LoadState refuses a mismatch either way, before it
	// loads anything. Each machine needs its own Net (its own TAP): copy
	// the struct, never share or modify a Net another Spec points to.
	Net *Net
}

// Device layouts of a machine (Spec.Machine).
const (
	// MachineLegacy has the i8254 PIT. Linux leaves the PIT running
	// once its local APIC timer takes over, and QEMU then wakes up about
	// 36 times a second per machine to emulate it: half the CPU an idle
	// machine cost under TCG. Templates and snapshots made before
	// 2026-12 have this layout.
	MachineLegacy = ""
	// MachineNoPIT has no PIT: the guest's clock events come from its
	// local APIC timer (calibrated without the PIT, or a TSC-deadline timer
	// that needs no calibration), on KVM as under TCG.
	MachineNoPIT = "nopit"
	// MachineCurrent is the layout of new templates.
	MachineCurrent = MachineNoPIT
)

// Net is a machine's network interface: a virtio-net device whose host end
// is a TAP device the caller opened.
type Net struct {
	// TAP is an open TAP device, created with IFF_TAP|IFF_NO_PI|
	// IFF_VNET_HDR and one queue, in whatever network namespace the
	// machine's traffic belongs to: the VMM needs neither privileges nor a
	// namespace for it. Start passes the VMM a duplicate and checks the
	// flags; the caller still owns TAP and may close it once Start has
	// returned (a TAP that is not persistent then lives exactly as long
	// as the VMM). Required by Start; not recorded (a Spec written as
	// JSON keeps only MAC).
	TAP *os.File `json:"-"`
	// MAC is the guest's MAC address, e.g. "52:54:00:70:6e:02". A
	// restore must give the MAC the saved machine had: the guest
	// configured itself with it, and the saved device state carries it.
	MAC string
}

// Driver starts machines. Implementations are safe for concurrent use.
type Driver interface {
	// Start launches a VMM process for spec and returns once its control
	// channel answers. With spec.Incoming the machine is paused and waiting
	// for LoadState; otherwise it is booting. The agent socket
	// (Machine.AgentSocket) exists when Start returns. On error nothing is
	// left running.
	//
	// With spec.Net, Start fails (starting nothing) if Net.TAP is nil,
	// is not a TAP device with the flags Net documents, or MAC is not a
	// unicast MAC address.
	//
	// A driver that confines its VMMs (runs each as its own unprivileged
	// user) makes the machine's files accessible to that user first: it
	// changes the owner of Disk and ConsoleLog (created if missing) to the
	// machine's user and spec.GID (mode 0600), and the group of MemoryFile
	// to spec.GID (mode 0660); RunDir becomes mode 0700 and stays the
	// caller's. Kernel and Initramfs must be world-readable; they are not
	// changed. Start fails with an error wrapping ErrExhausted when the
	// driver has no user id left.
	Start(ctx context.Context, spec Spec) (Machine, error)

	// Adopt takes over a VMM process that an earlier host agent started
	// for spec (found through spec.RunDir), after that agent's restart. It
	// fails if the process is gone or does not serve spec.RunDir; nothing
	// is left changed then.
	Adopt(ctx context.Context, spec Spec) (Machine, error)

	// Processes lists the live VMM processes of this driver whose machine's
	// run directory is in runDir, mapping each pid to that directory's
	// name, whether or not they were started or adopted by this driver: a
	// host agent finds the VMMs it must kill after a crash with it.
	Processes(runDir string) map[int]string

	// CleanupStale removes what machines that are gone left behind (a
	// confining driver's cgroups and user ids) and reports the processes it
	// found in its machines' place that it neither started nor adopted.
	// Call it after adopting the running VMMs. Safe for concurrent use with
	// Start.
	CleanupStale() (Leftovers, error)

	// ResolveAccel turns accel.Auto into accel.KVM or accel.TCG by booting
	// kernel once (a canary), and returns the accelerator with why it was
	// chosen; accel.KVM and accel.TCG are returned as they are. cache, if not
	// empty, is a file that remembers the answer for this kernel.
	ResolveAccel(ctx context.Context, want accel.Accel, kernel, cache string) (resolved accel.Accel, why string, err error)

	// TSCkHz is the host's TSC frequency in kHz (0 if unknown), which a
	// guest kernel is told so that it need not calibrate under emulation.
	TSCkHz() int
}

// Leftovers is what Driver.CleanupStale found.
type Leftovers struct {
	// Removed are the cgroups of machines whose process is gone.
	Removed []string
	// Orphans are processes in machine cgroups that this driver neither
	// started nor adopted: VMMs of a previous run that were not adopted,
	// or (when several host agents share one host, as tests do) VMMs of
	// another agent. Their UIDs stay taken until they exit.
	Orphans []Orphan
}

// Orphan is a process in a machine cgroup that the driver does not own.
type Orphan struct {
	PID int
	// RunDir is the host run directory the VMM serves, from its command
	// line; "" if the process is no VMM of this driver's making. Kill an
	// orphan only if RunDir is one of yours.
	RunDir string
}

// Machine is one running VMM process. Methods other than Kill and Done
// are not safe to call concurrently with each other.
type Machine interface {
	// PID of the VMM process.
	PID() int
	// AgentSocket is the host end of the guest agent's serial port: a unix
	// socket the host connects to. Connecting before LoadState means the
	// guest never observes a disconnect across a restore.
	AgentSocket() string

	// LoadState loads device state saved by SaveState into a machine
	// started with Spec.Incoming and leaves it paused. It fails without
	// loading anything if the saved machine had a network interface and
	// this one has none (Spec.Net), or the reverse.
	LoadState(ctx context.Context, statePath string) error
	// Pause stops the vCPUs. Idempotent.
	Pause(ctx context.Context) error
	// Resume starts the vCPUs. Idempotent.
	Resume(ctx context.Context) error
	// SaveState writes the device state (not RAM) of a paused machine to
	// path, which the host creates (mode 0600; the VMM, which may not see
	// host paths, writes through a file descriptor). Guest RAM is whatever
	// Spec.MemoryFile holds plus, for a copy-on-write mapping, the
	// machine's private pages (see RAMMapping).
	SaveState(ctx context.Context, path string) error
	// RAMMapping locates guest RAM in the VMM's address space so that its
	// private (dirtied) pages can be found through /proc/PID/pagemap.
	RAMMapping() (RAMMapping, error)

	// Kill stops the machine (SIGKILL if it does not quit at once), waits
	// for the process to exit and removes its sockets. Idempotent.
	Kill() error
	// Done is closed when the VMM process has exited, for any reason.
	Done() <-chan struct{}
	// ExitError describes why the process exited (nil before Done, or if
	// Kill ended it).
	ExitError() error
}

// RAMMapping is the guest-RAM region of a VMM process.
type RAMMapping struct {
	PID   int
	Start uint64 // virtual address of guest physical address 0
	Size  uint64 // bytes
}

// ErrExited is returned by Machine methods after the VMM process has exited.
var ErrExited = errors.New("vmm process exited")

// ErrExhausted is returned by Driver.Start when a per-host resource of the
// driver (such as the user ids of confined VMMs) is used up.
var ErrExhausted = fmt.Errorf("vmm: %w", host.ErrExhausted)

// DefaultStartTimeout bounds how long Start waits for the control channel.
const DefaultStartTimeout = 10 * time.Second
