package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"golang.org/x/sys/unix"
)

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

// fileID identifies a file by device and inode.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: st.Dev, ino: st.Ino}, nil
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
