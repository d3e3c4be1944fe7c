package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/pandastack/pandastack/internal/hostagent/internal/qmp"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"golang.org/x/sys/unix"
)

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
