package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"golang.org/x/sys/unix"
)

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
