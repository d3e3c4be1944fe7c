package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/pandastack/pandastack/internal/hostagent/internal/osthread"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"golang.org/x/sys/unix"
)

// Confinement. Every QEMU process the driver starts (unless
// Config.NoConfine) runs:
//
//   - as a user of its own, from Config.UIDBase..+UIDCount, with the
//     primary group Spec.GID, no supplementary groups, no capabilities and
//     an empty environment;
//   - in a mount namespace of its own that holds only its jail: a small
//     read-only tmpfs root with read-only binds of /usr and
//     /etc/ld.so.cache (the host's /lib, /lib64, /bin, /sbin appear as the
//     same symlinks into /usr, or as read-only binds where they are
//     directories), device nodes null, zero, random, urandom (and kvm under
//     KVM, owned by the machine's user, so no kvm group is needed), and
//     binds of exactly the machine's files at fixed paths (jail* below).
//     Nothing in it is writable but the disk, the memory file and the
//     console log: the agent and QMP sockets are bound by the host in the
//     run directory and handed to QEMU as listening descriptors;
//   - in network, IPC and PID namespaces of its own (vmmNamespaces), made
//     by the clone that starts it. QEMU opens no socket of its own: its
//     TAP and its agent and QMP sockets are descriptors the host opened,
//     which work whatever namespace their holder is in. So its network
//     namespace holds a loopback device that is down and no route: a
//     process that escaped QEMU reaches no address at all (not the cloud
//     metadata service, not a service on the host's loopback), and no
//     abstract unix socket of the host (their names are per network
//     namespace). Its IPC namespace hides the host's System V IPC objects
//     and POSIX message queues. In its PID namespace it is PID 1 and sees
//     no other process; the host knows it by its host PID (Machine.PID,
//     the PID file, Adopt's and the fork's /proc/PID/...), and as the init
//     of a namespace it gets from the host only the signals it handles
//     (SIGTERM, SIGINT, SIGHUP: QEMU's orderly exit) and SIGKILL, which is
//     what Kill sends; a fault still kills it;
//   - in a cgroup of its own (see cgroup.go) with cpu, memory and pids
//     limits, entered before the process runs, so before it allocates
//     anything;
//   - with RLIMIT_CORE 0, RLIMIT_NOFILE 1024, RLIMIT_NPROC = Config.PidsMax
//     (counted per user, hence per machine), RLIMIT_MEMLOCK 0 and
//     RLIMIT_FSIZE = the larger of its disk and memory file, set with
//     prlimit right after the exec (Linux offers no way to set another
//     process's limits before it runs, short of a helper binary);
//   - under QEMU's own seccomp sandbox (-sandbox on,...), as before.
//
// No /proc, /sys, /tmp or /dev/shm in the jail: QEMU 7.2 and its libraries
// probe /proc/self/exe, /proc/self/status, /proc/stat, /proc/mounts,
// /proc/filesystems, /sys/devices/system/{cpu/possible,node}, /sys/bus/nd,
// /etc/localtime, /etc/libnl/classid and /dev/sgx_vepc (strace of a jailed
// start) and copes without every one of them: it finds its firmware and
// accelerator module from argv[0], the binary's absolute path under /usr.
//
// How the namespace is built (osthread.Disposable, startInJail): a goroutine
// locks itself to an OS thread, unshares the mount namespace of that thread
// only (CLONE_NEWNS implies CLONE_FS, so root, working directory and umask
// become its own too), makes every mount private, mounts the jail tmpfs on
// Config.HostDir/jail, binds the files, pivot_roots into the jail and
// detaches the old root. It then starts QEMU from that same thread: the
// child inherits the thread's namespace and root and, under cgroup v1, its
// cgroups (the thread enters them just before the fork); under v2 the child
// is created in its cgroup (clone3 CLONE_INTO_CGROUP). The goroutine returns
// without unlocking the thread, so the Go runtime terminates the thread
// instead of reusing it (threads the runtime creates meanwhile are cloned
// from its template thread, not from this one). Nothing is mounted in the
// host's namespace, no helper binary runs, and the namespace disappears
// with the QEMU process. The network, IPC and PID namespaces are made by
// the clone itself (clone3, with CLONE_INTO_CGROUP under v2): a PID
// namespace can only be entered at birth. pivot_root rather than chroot: with chroot alone the
// namespace would still hold a copy of every host mount, one chroot escape
// away; after pivot_root and the detach, /proc/PID/mountinfo of a VMM lists
// its jail's mounts and nothing else.

// Paths of the machine's files inside its jail.
const (
	jailDisk    = "/vm/disk"
	jailMem     = "/vm/mem"
	jailKernel  = "/vm/kernel"
	jailInitrd  = "/vm/initrd"
	jailConsole = "/vm/console.log"
)

// vmmNamespaces are the namespaces a confined VMM is born in (clone
// flags of its exec, besides the mount namespace its thread made): an
// empty network namespace, and IPC and PID namespaces of its own. See the
// comment at the top of the file.
const vmmNamespaces = unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWPID

// rlimitNOFILE bounds a VMM's open files: a microvm with one disk and two
// sockets uses a few dozen (more under KVM: eventfds per virtqueue).
const rlimitNOFILE = 1024

// jailFile is a host file or directory bound into a jail.
type jailFile struct {
	host, jail string
	dir        bool
	rw         bool
}

// hostRoot is how the host's system directories appear in every jail.
type hostRoot struct {
	name    string // "/usr", "/lib", ...
	symlink string // the link's target if the host's entry is a symlink; else it is bound read-only
}

// devNode is a character device created in a jail's /dev.
type devNode struct {
	name string
	rdev uint64
	mode uint32
	own  bool // owned by the machine's user (kvm), else root
}

// confinement is what Driver.spawn needs to confine one process.
type confinement struct {
	gid     uint32
	limits  cgroupLimits
	files   []jailFile
	kvm     bool
	prepare func(uid, gid int) error // gives the files to the machine's user
	// fsize bounds the files the process writes (RLIMIT_FSIZE): a VMM
	// must not grow its disk, or its console log, until the host's disk
	// is full.
	fsize int64
}

// box is one confined process's share of the host: its UID and cgroup.
type box struct {
	d    *Driver
	uid  uint32
	gid  uint32
	cg   *vmCgroup
	lock *os.File // shared flock, held from the claim until the process is in its cgroup

	releaseOnce sync.Once
}

// release returns the box's cgroup and UID; call it once its process is
// gone. Idempotent.
func (b *box) release() error {
	var err error
	b.releaseOnce.Do(func() {
		if b.cg != nil {
			err = b.cg.remove()
		}
		b.d.uids.release(b.uid)
	})
	return err
}

func (b *box) unlock() {
	if b.lock != nil {
		unix.Flock(int(b.lock.Fd()), unix.LOCK_UN)
		b.lock.Close()
		b.lock = nil
	}
}

// uidPool hands out the UIDs of confined machines, one per machine. Which
// UIDs are free across processes is decided by the cgroups (see
// cgroupSet.create); the pool remembers those this driver holds and where
// to look next: the search goes round the range, so a released UID is
// handed out again as late as possible.
type uidPool struct {
	mu   sync.Mutex
	base uint32
	n    uint32
	next uint32
	used map[uint32]bool
}

func newUIDPool(base uint32, n int) *uidPool {
	return &uidPool{base: base, n: uint32(n), used: map[uint32]bool{}}
}

// claim finds a UID not held by this driver for which try succeeds; try
// returns errCgroupTaken to move on to the next.
func (p *uidPool) claim(try func(uid uint32) error) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := uint32(0); i < p.n; i++ {
		off := (p.next + i) % p.n
		uid := p.base + off
		if p.used[uid] {
			continue
		}
		err := try(uid)
		if errors.Is(err, errCgroupTaken) {
			continue
		}
		if err != nil {
			return 0, err
		}
		p.used[uid] = true
		p.next = (off + 1) % p.n
		return uid, nil
	}
	return 0, fmt.Errorf("all %d vmm user ids (%d-%d) are in use: %w", p.n, p.base, p.base+p.n-1, vmm.ErrExhausted)
}

// markUsed records uid as held (an adopted machine). It reports whether
// uid is in the pool's range and was not held already.
func (p *uidPool) markUsed(uid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if uid < p.base || uid-p.base >= p.n || p.used[uid] {
		return false
	}
	p.used[uid] = true
	return true
}

func (p *uidPool) release(uid uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.used, uid)
}

func (p *uidPool) inUse(uid uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used[uid]
}

// lockFile is the host-wide lock that orders claims (shared) against
// CleanupStale (exclusive), across every process whose driver uses the
// same HostDir and Cgroup.
func (d *Driver) lockFile(how int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(d.cfg.HostDir, d.cfg.Cgroup+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open vmm lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return f, nil
}

// claim reserves a UID and a cgroup with lim for a new process.
func (d *Driver) claim(gid uint32, lim cgroupLimits) (*box, error) {
	lock, err := d.lockFile(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	b := &box{d: d, gid: gid, lock: lock}
	b.uid, err = d.uids.claim(func(uid uint32) error {
		cg, err := d.cgroups.create(uid, lim)
		b.cg = cg
		return err
	})
	if err != nil {
		b.unlock()
		return nil, err
	}
	return b, nil
}

// spawn starts cmd; unless the driver is unconfined, it does so in a new
// box (returned, to be released once the process is gone) according to c.
func (d *Driver) spawn(cmd *exec.Cmd, c confinement) (*box, error) {
	if d.cfg.NoConfine {
		// Its own session: a terminal's Ctrl-C must not reach the VMM, and
		// the VMM outlives a crashed host agent so that it can be adopted.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		return nil, cmd.Start()
	}
	if c.gid == 0 {
		c.gid = d.cfg.GID
	}
	b, err := d.claim(c.gid, c.limits)
	if err != nil {
		return nil, err
	}
	defer b.unlock()
	fail := func(err error) (*box, error) {
		b.release()
		return nil, err
	}
	if c.prepare != nil {
		if err := c.prepare(int(b.uid), int(b.gid)); err != nil {
			return fail(err)
		}
	}
	cmd.Dir = "/"
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setsid:     true,
		Credential: &syscall.Credential{Uid: b.uid, Gid: b.gid, Groups: []uint32{}},
		Cloneflags: vmmNamespaces,
	}
	if d.cgroups.v2 {
		fd, err := unix.Open(b.cg.dirs[0], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("open cgroup: %w", err))
		}
		defer unix.Close(fd)
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	}
	var in, out []*os.File
	if !d.cgroups.v2 {
		if in, out, err = b.cg.enterV1(); err != nil {
			return fail(err)
		}
		defer func() {
			for _, f := range append(in, out...) {
				f.Close()
			}
		}()
	}
	if err := osthread.Disposable(func() error { return d.startInJail(cmd, b, c, in, out) }); err != nil {
		return fail(err)
	}
	return b, nil
}

// setRlimits lowers pid's limits (never raises one: only lowering is
// allowed without CAP_SYS_RESOURCE).
func setRlimits(pid, nproc int, fsize int64) error {
	for _, l := range []struct {
		res int
		v   uint64
	}{
		{unix.RLIMIT_CORE, 0},
		{unix.RLIMIT_FSIZE, uint64(fsize)},
		{unix.RLIMIT_NOFILE, rlimitNOFILE},
		{unix.RLIMIT_NPROC, uint64(nproc)},
		{unix.RLIMIT_MEMLOCK, 0},
	} {
		var old unix.Rlimit
		if err := unix.Prlimit(pid, l.res, nil, &old); err != nil {
			return fmt.Errorf("get rlimit %d of vmm: %w", l.res, err)
		}
		v := min(l.v, old.Max)
		r := unix.Rlimit{Cur: v, Max: v}
		if err := unix.Prlimit(pid, l.res, &r, nil); err != nil {
			return fmt.Errorf("set rlimit %d of vmm: %w", l.res, err)
		}
	}
	return nil
}

// startInJail runs on a locked thread that it gives a private mount
// namespace whose root is the jail, then starts cmd from it. Under cgroup
// v1 the thread enters the machine's cgroups through in (opened on the
// host: the jail has no /sys) so that the child is born there, and leaves
// through out.
func (d *Driver) startInJail(cmd *exec.Cmd, b *box, c confinement, in, out []*os.File) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("jail: unshare mount namespace: %w", err)
	}
	// Umask is the thread's own now (CLONE_NEWNS implies CLONE_FS): 0
	// while building, so that modes are exactly as given; 077 for QEMU,
	// which inherits it.
	unix.Umask(0)
	if err := d.buildJail(b, c); err != nil {
		return fmt.Errorf("jail: %w", err)
	}
	unix.Umask(0o077)
	// "0" is the writing thread itself. Moving the current thread is the
	// one move that skips the cgroup_threadgroup_rwsem write lock (an RCU
	// grace period, 3-5 ms per hierarchy here); naming it by TID does not.
	tid := []byte("0")
	for _, f := range in {
		if _, err := f.Write(tid); err != nil {
			return fmt.Errorf("enter cgroup: %w", err)
		}
	}
	err := cmd.Start()
	// Back out at once (the child stays): the thread must not count
	// against the machine's limits while it lives on.
	for _, f := range out {
		f.Write(tid)
	}
	if err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	if err := d.limitProcess(cmd.Process.Pid, b, c); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	return nil
}

// limitProcess sets the rlimits of the new VMM process pid. prlimit on
// another user's process needs CAP_SYS_RESOURCE, which root in a container
// may lack; a caller whose user and group ids all equal the target's may
// lower its limits without it. So the thread, which is about to be
// discarded, first becomes the machine's user (setresgid and setresuid
// are per-thread system calls; Go's wrappers would change every thread).
func (d *Driver) limitProcess(pid int, b *box, c confinement) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(b.gid), uintptr(b.gid), uintptr(b.gid)); e != 0 {
		return fmt.Errorf("become the vmm group: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(b.uid), uintptr(b.uid), uintptr(b.uid)); e != 0 {
		return fmt.Errorf("become the vmm user: %w", e)
	}
	return setRlimits(pid, d.cfg.PidsMax, c.fsize)
}

// buildJail makes the jail and pivots into it. It runs in the locked
// thread's private mount namespace.
func (d *Driver) buildJail(b *box, c confinement) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := d.jailDir
	if err := unix.Mount("panda-vm", root, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=256"); err != nil {
		return fmt.Errorf("mount jail root: %w", err)
	}
	in := func(p string) string { return filepath.Join(root, p) }
	for _, dir := range []string{"/dev", "/etc", "/vm", "/.old"} {
		if err := unix.Mkdir(in(dir), 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", dir, err)
		}
	}
	for _, r := range d.root {
		if r.symlink != "" {
			if err := unix.Symlink(r.symlink, in(r.name)); err != nil {
				return fmt.Errorf("symlink %s: %w", r.name, err)
			}
			continue
		}
		if err := bind(r.name, in(r.name), true, false, true); err != nil {
			return err
		}
	}
	if d.ldCache {
		if err := bind("/etc/ld.so.cache", in("/etc/ld.so.cache"), false, false, false); err != nil {
			return err
		}
	}
	for _, n := range d.devices {
		if n.name == "kvm" && !c.kvm {
			continue
		}
		p := in("/dev/" + n.name)
		if err := unix.Mknod(p, unix.S_IFCHR|n.mode, int(n.rdev)); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", n.name, err)
		}
		if n.own {
			if err := unix.Chown(p, int(b.uid), int(b.gid)); err != nil {
				return fmt.Errorf("chown /dev/%s: %w", n.name, err)
			}
		}
	}
	for _, f := range c.files {
		if err := bind(f.host, in(f.jail), f.dir, f.rw, false); err != nil {
			return err
		}
	}
	if err := unix.PivotRoot(root, in("/.old")); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach host root: %w", err)
	}
	if err := unix.Rmdir("/.old"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("make jail root read-only: %w", err)
	}
	return nil
}

// bind binds host onto jail (created, with its parents, as a directory or
// an empty file), read-only unless rw, executable only if executable.
func bind(host, jail string, dir, rw, executable bool) error {
	if err := os.MkdirAll(filepath.Dir(jail), 0o755); err != nil {
		return err
	}
	if dir {
		if err := unix.Mkdir(jail, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", jail, err)
		}
	} else {
		// mknod, not open: a descriptor open for writing on the jail's
		// root, even for a moment, can be copied into a child that another
		// goroutine is forking (until that child execs), and then the
		// read-only remount of the root fails with EBUSY.
		if err := unix.Mknod(jail, unix.S_IFREG|0o600, 0); err != nil {
			return fmt.Errorf("create %s: %w", jail, err)
		}
	}
	if err := unix.Mount(host, jail, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", host, err)
	}
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_NOSUID | unix.MS_NODEV)
	if !rw {
		flags |= unix.MS_RDONLY
	}
	if !executable {
		flags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("", jail, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s: %w", host, err)
	}
	return nil
}

// hostLayout finds how the host's system directories must appear in a
// jail for binary (a path under them) to run: /usr is bound, and /lib,
// /lib64, /bin, /sbin (and multilib /lib32, /libx32) are the host's
// symlinks into it (merged /usr, Debian 12) or bound read-only too.
func hostLayout(binary string) ([]hostRoot, error) {
	var out []hostRoot
	under := false
	for _, name := range []string{"/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"} {
		st, err := os.Lstat(name)
		if err != nil {
			continue
		}
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(name)
			if err != nil {
				return nil, err
			}
			out = append(out, hostRoot{name: name, symlink: target})
		case st.IsDir():
			out = append(out, hostRoot{name: name})
			if strings.HasPrefix(binary, name+"/") {
				under = true
			}
		}
	}
	if !under {
		return nil, fmt.Errorf("qemu binary %s is outside /usr (and /lib, /bin, /sbin): a confined vmm could not run it", binary)
	}
	return out, nil
}

// hostDevices are the device nodes a jail gets, with the host's numbers.
func hostDevices() ([]devNode, error) {
	var out []devNode
	for _, n := range []struct {
		name string
		mode uint32
		own  bool
	}{{"null", 0o666, false}, {"zero", 0o666, false}, {"random", 0o666, false}, {"urandom", 0o666, false}, {"kvm", 0o600, true}} {
		var st unix.Stat_t
		if err := unix.Stat("/dev/"+n.name, &st); err != nil {
			if n.name == "kvm" {
				continue
			}
			return nil, fmt.Errorf("device for vmm jails: %w", err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, fmt.Errorf("device for vmm jails: /dev/%s is not a character device", n.name)
		}
		out = append(out, devNode{name: n.name, rdev: st.Rdev, mode: n.mode, own: n.own})
	}
	return out, nil
}
