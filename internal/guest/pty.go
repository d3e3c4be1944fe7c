package guest

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// defaultTerm is TERM for a process on a PTY unless the request sets it.
const defaultTerm = "xterm-256color"

// openPTY opens a new pseudo-terminal of the given size: the master
// (pollable, so Close interrupts a read) and the slave. Neither becomes
// the agent's controlling terminal.
func openPTY(size guestproto.PTYSize) (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	defer func() {
		if err != nil {
			_ = master.Close()
		}
	}()
	var slaveFD int
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock pty: %w", err)
		}
		if err := setSize(fd, size); err != nil {
			return err
		}
		// The peer by the master's fd, not by a path: /dev/pts may be
		// another devpts instance than /dev/ptmx leads to.
		n, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
		if errno == 0 {
			slaveFD = int(n)
			return nil
		}
		num, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
		if err != nil {
			return fmt.Errorf("pty number: %w", err)
		}
		slaveFD, err = unix.Open("/dev/pts/"+strconv.Itoa(num), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open pty slave: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return master, os.NewFile(uintptr(slaveFD), "pty-slave"), nil
}

// control runs fn with f's descriptor without making f blocking (as Fd
// would, which stops Close from interrupting a blocked Read).
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func setSize(fd int, size guestproto.PTYSize) error {
	ws := &unix.Winsize{Row: uint16(size.Rows), Col: uint16(size.Cols)}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws); err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	return nil
}

// startPTYProcess starts argv as the leader of a new session whose
// controlling terminal is a new PTY's slave, which is also its stdin,
// stdout and stderr. The process's stdin and stdout are both the master;
// stderr is nil.
func (s *Server) startPTYProcess(path string, argv, env []string, cwd string, cred *syscall.Credential, size guestproto.PTYSize) (*process, error) {
	master, slave, err := openPTY(size)
	if err != nil {
		return nil, err
	}
	defer slave.Close()
	if cred != nil {
		// The user's terminal, as login would make it.
		_ = slave.Chown(int(cred.Uid), -1)
	}
	fd := slave.Fd()
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{fd, fd, fd},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Credential: cred},
	}
	p := &process{stdin: master, stdout: master}
	p.pid, p.wait, err = s.reaper.Start(path, argv, attr)
	if err != nil {
		_ = master.Close()
		return nil, err
	}
	return p, nil
}

// resize sets the terminal size of a PTY process.
func (p *bgProc) resize(size guestproto.PTYSize) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.exit != nil:
		return guestproto.Errorf(guestproto.CodeExited, "process %d has exited", p.pid)
	case p.pty == nil:
		return guestproto.Errorf(guestproto.CodeInvalid, "process %d was not started on a terminal", p.pid)
	}
	if err := control(p.pty, func(fd int) error { return setSize(fd, size) }); err != nil {
		return err
	}
	p.size = size
	p.notifyLocked()
	return nil
}
