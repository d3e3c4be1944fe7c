package guest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// PortName is the virtio-serial port name the host gives the agent's channel.
const PortName = "panda"

// hostPoll bounds how long WaitHost sleeps when no SIGIO arrives.
const hostPoll = 100 * time.Millisecond

// FindPort returns the device of the virtio-serial port called name, found
// through sysfs (udev, which would make /dev/virtio-ports/NAME, is absent):
// the vportNpM whose sysDir/class/virtio-ports/vportNpM/name is name.
func FindPort(sysDir, name string) (string, error) {
	dirs, err := filepath.Glob(filepath.Join(sysDir, "class", "virtio-ports", "vport*"))
	if err != nil {
		return "", fmt.Errorf("find port %s: %w", name, err)
	}
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return filepath.Join("/dev", filepath.Base(d)), nil
		}
	}
	return "", fmt.Errorf("find port %s: %w", name, os.ErrNotExist)
}

// PortFromCmdline returns the value of panda.port= in a kernel command line.
func PortFromCmdline(cmdline string) string {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, "panda.port="); ok {
			return v
		}
	}
	return ""
}

// Port is the agent's end of the virtio-serial channel. The Linux driver
// returns 0 from read while the host side is disconnected and sends SIGIO to
// the owner of an O_ASYNC port when the host connects; WaitHost waits for
// that signal, or polls every 100 ms.
type Port struct {
	f      *os.File
	sig    chan os.Signal
	closed atomic.Bool
	done   chan struct{}
}

var _ guestproto.Transport = (*Port)(nil)

// OpenPort opens the port device at path.
func OpenPort(path string) (*Port, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open port: %w", err)
	}
	p := &Port{f: f, sig: make(chan os.Signal, 1), done: make(chan struct{})}
	if err := p.control(func(fd int) error {
		_, err := unix.FcntlInt(uintptr(fd), unix.F_SETOWN, os.Getpid())
		return err
	}); err != nil {
		f.Close()
		return nil, fmt.Errorf("open port: set owner: %w", err)
	}
	signal.Notify(p.sig, syscall.SIGIO)
	return p, nil
}

func (p *Port) Read(b []byte) (int, error)  { return p.f.Read(b) }
func (p *Port) Write(b []byte) (int, error) { return p.f.Write(b) }

// Close closes the port; a blocked Read returns and WaitHost fails.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	close(p.done)
	signal.Stop(p.sig)
	return p.f.Close()
}

// WaitHost waits until the host may have connected: a SIGIO, 100 ms, or ctx.
func (p *Port) WaitHost(ctx context.Context) error {
	if p.closed.Load() {
		return os.ErrClosed
	}
	select { // drop a stale signal
	case <-p.sig:
	default:
	}
	if err := p.setAsync(true); err != nil {
		return fmt.Errorf("wait for host: %w", err)
	}
	defer p.setAsync(false)
	t := time.NewTimer(hostPoll)
	defer t.Stop()
	select {
	case <-p.sig:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	case <-p.done:
		return os.ErrClosed
	}
	return nil
}

// setAsync turns O_ASYNC on or off, keeping the other status flags (the Go
// runtime's O_NONBLOCK).
func (p *Port) setAsync(on bool) error {
	return p.control(func(fd int) error {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err != nil {
			return err
		}
		if on {
			fl |= unix.O_ASYNC
		} else {
			fl &^= unix.O_ASYNC
		}
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl)
		return err
	})
}

func (p *Port) control(fn func(fd int) error) error {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
