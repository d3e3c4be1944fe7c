// Package qemu implements vmm.Driver with QEMU's microvm machine: one
// qemu-system-x86_64 process per machine, controlled over QMP, running under
// QEMU's seccomp sandbox with only a virtio-blk disk and a virtio-serial port
// for the guest agent. Device state is saved with xen-save-devices-state
// (RAM stays in the memory file) and loaded with migrate-incoming from a file
// descriptor, so a restore never copies guest RAM.
package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/qmp"
	"github.com/pandastack/pandastack/internal/vmm"
	"golang.org/x/sys/unix"
)

// Config configures the driver.
type Config struct {
	// Binary is the QEMU executable (default qemu-system-x86_64 on PATH).
	Binary string
	// NoSandbox disables QEMU's seccomp sandbox (debugging only).
	NoSandbox bool
	// ExtraArgs are appended to every QEMU command line (debugging only,
	// e.g. "-d in_asm -D /tmp/tb.log").
	ExtraArgs []string
	Logger    *slog.Logger
}

// Driver starts QEMU microvm machines.
type Driver struct {
	cfg Config
}

var _ vmm.Driver = (*Driver)(nil)

// New returns a driver. It starts nothing.
func New(cfg Config) (*Driver, error) {
	if cfg.Binary == "" {
		cfg.Binary = "qemu-system-x86_64"
	}
	p, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("find qemu: %w (install the qemu-system-x86 package: make setup)", err)
	}
	cfg.Binary = p
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg}, nil
}

const defaultTBCacheMiB = 64

// args builds the QEMU command line for spec.
func (d *Driver) args(spec vmm.Spec) ([]string, error) {
	if spec.MemoryMiB <= 0 {
		return nil, fmt.Errorf("memory must be positive, got %d MiB", spec.MemoryMiB)
	}
	if spec.VCPUs <= 0 {
		spec.VCPUs = 1
	}
	accel := ""
	switch spec.Accel {
	case vmm.AccelKVM:
		accel = "kvm"
	case vmm.AccelTCG:
		tb := spec.TBCacheMiB
		if tb <= 0 {
			tb = defaultTBCacheMiB
		}
		accel = fmt.Sprintf("tcg,thread=multi,tb-size=%d", tb)
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
	console := "null"
	if spec.ConsoleLog != "" {
		console = "file:" + spec.ConsoleLog
	}
	a := []string{
		"-name", "panda,debug-threads=on",
		"-machine", "microvm,acpi=on,pit=on,pic=on,rtc=on,isa-serial=on,memory-backend=mem",
		"-accel", accel,
		"-cpu", cpuModel(spec.Accel),
		"-m", fmt.Sprintf("%dM", spec.MemoryMiB),
		"-smp", strconv.Itoa(spec.VCPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s,prealloc=%s,discard-data=off",
			spec.MemoryMiB, qemuEscape(spec.MemoryFile), share, prealloc),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", console,
		"-drive", fmt.Sprintf("id=vda,file=%s,format=raw,if=none,cache=writeback,discard=unmap,detect-zeroes=unmap", qemuEscape(spec.Disk)),
		"-device", "virtio-blk-device,drive=vda",
		"-device", "virtio-serial-device,max_ports=2",
		"-chardev", fmt.Sprintf("socket,id=agent,path=%s,server=on,wait=off", qemuEscape(agentSocket(spec.RunDir))),
		"-device", "virtserialport,chardev=agent,name=panda",
		"-qmp", fmt.Sprintf("unix:%s,server=on,wait=off", qemuEscape(qmpSocket(spec.RunDir))),
		"-global", "migration.send-configuration=off",
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
		a = append(a, "-kernel", spec.Kernel, "-initrd", spec.Initramfs, "-append", spec.Cmdline)
	}
	return append(a, d.cfg.ExtraArgs...), nil
}

func cpuModel(a vmm.Accel) string {
	if a == vmm.AccelKVM {
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

// Start implements vmm.Driver.
func (d *Driver) Start(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	if len(agentSocket(spec.RunDir)) > 100 {
		return nil, fmt.Errorf("run directory %s is too long for a unix socket path", spec.RunDir)
	}
	for _, f := range []struct{ what, path string }{
		{"kernel", spec.Kernel}, {"initramfs", spec.Initramfs}, {"memory file", spec.MemoryFile}, {"disk", spec.Disk},
	} {
		if _, err := os.Stat(f.path); err != nil {
			return nil, fmt.Errorf("start vm: %s: %w", f.what, err)
		}
	}
	args, err := d.args(spec)
	if err != nil {
		return nil, fmt.Errorf("start vm: %w", err)
	}
	os.Remove(agentSocket(spec.RunDir))
	os.Remove(qmpSocket(spec.RunDir))
	cmd := exec.Command(d.cfg.Binary, args...)
	cmd.Dir = spec.RunDir
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 16 << 10}
	// Its own session: a terminal's Ctrl-C must not reach the VMM, and the
	// VMM outlives a crashed host agent so that it can be adopted again.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	m := newMachine(spec, cmd.Process.Pid, d.cfg.Logger)
	m.stderr = &stderr
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
// QEMU that serves spec.RunDir.
func (d *Driver) Adopt(ctx context.Context, spec vmm.Spec) (vmm.Machine, error) {
	b, err := os.ReadFile(PIDFile(spec.RunDir))
	if err != nil {
		return nil, fmt.Errorf("adopt vm: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return nil, fmt.Errorf("adopt vm: bad pid file %q", b)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("adopt vm: process %d: %w", pid, vmm.ErrExited)
	}
	if !bytes.Contains(cmdline, []byte(qmpSocket(spec.RunDir))) {
		return nil, fmt.Errorf("adopt vm: process %d is not the vmm of %s: %w", pid, spec.RunDir, vmm.ErrExited)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt vm: pidfd of %d: %w", pid, err)
	}
	m := newMachine(spec, pid, d.cfg.Logger)
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

// Machine is a QEMU process.
type Machine struct {
	spec   vmm.Spec
	pid    int
	log    *slog.Logger
	stderr *bytes.Buffer

	qmp *qmp.Client

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
	select {
	case <-m.done:
		return fmt.Errorf("%s: %w", cmd, vmm.ErrExited)
	default:
	}
	err := m.qmp.Execute(ctx, cmd, args, out)
	if err != nil {
		select {
		case <-m.done:
			return fmt.Errorf("%s: %w", cmd, vmm.ErrExited)
		default:
		}
	}
	return err
}

// LoadState implements vmm.Machine.
func (m *Machine) LoadState(ctx context.Context, statePath string) error {
	f, err := os.Open(statePath)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	defer f.Close()
	if err := m.qmp.ExecuteWithFDs(ctx, "getfd", map[string]string{"fdname": "state"}, nil, []int{int(f.Fd())}); err != nil {
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

// SaveState implements vmm.Machine. The machine must be paused.
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
	// live=false keeps the block devices active in this process (live=true
	// would hand them over to a migration target and leave us without disks).
	if err := m.exec(ctx, "xen-save-devices-state", map[string]any{"filename": path, "live": false}, nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// RAMMapping implements vmm.Machine by finding the mapping of the memory
// file in /proc/PID/maps.
func (m *Machine) RAMMapping() (vmm.RAMMapping, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", m.pid))
	if err != nil {
		return vmm.RAMMapping{}, fmt.Errorf("read maps: %w", err)
	}
	want := uint64(m.spec.MemoryMiB) << 20
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 6 || fields[5] != m.spec.MemoryFile {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(fields[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || off != 0 {
			continue
		}
		if end-start == want {
			return vmm.RAMMapping{PID: m.pid, Start: start, Size: want}, nil
		}
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
	if m.qmp != nil {
		m.qmp.Close()
	}
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
