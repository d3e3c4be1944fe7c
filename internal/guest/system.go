package guest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Defaults the agent sets as PID 1.
const (
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	DefaultHome = "/root"
	DefaultLang = "C.UTF-8"
)

type mountSpec struct {
	target, fstype string
	flags          uintptr
	data           string
}

// systemMounts are mounted, in order, where nothing is mounted yet. /tmp
// stays on the rootfs.
var systemMounts = []mountSpec{
	{"/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
	{"/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
}

// quietKnobs keep an idle guest's kernel from waking up for housekeeping
// nobody asked for: sysctls and sysfs files, by absolute path, with the
// value written at start. Every wakeup of an idle guest costs its VMM host
// CPU (under TCG each one is emulated: ~6 of them a second were most of an
// idle sandbox's 0.46 % of a core; docs/benchmarks.md, "panda bench
// density"). None changes what a program in the guest sees:
//   - vm.compaction_proactiveness 0: no proactive compaction (kcompactd
//     woke every 500 ms); compaction on demand, for an allocation that
//     needs it, is unchanged;
//   - vm.stat_interval 10: per-CPU memory counters are folded every 10 s
//     instead of every second (/proc/meminfo's figures stay exact to
//     within those counters' batch);
//   - kernel.watchdog 0: no soft/hard lockup detector, whose timer fired
//     every 4 s (a VM's vCPU can be descheduled by the host for longer
//     than the detector's threshold anyway, which makes it report false
//     lockups);
//   - khugepaged scans every 60 s instead of every 10 s (the kernel's own
//     pause after a failed huge page allocation): it only merges pages
//     that are mapped already into huge pages, in the background, so
//     programs see the same memory; a long-running one gets its huge
//     pages later (a fault in a huge-page-sized range still gets one at
//     once), and an idle guest's memory grows less.
var quietKnobs = []struct{ path, value string }{
	{"/proc/sys/vm/compaction_proactiveness", "0"},
	{"/proc/sys/vm/stat_interval", "10"},
	{"/proc/sys/kernel/watchdog", "0"},
	{"/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs", "60000"},
}

// InitSystem prepares the guest when the agent is PID 1: it mounts the
// pseudo filesystems that are not mounted yet, sets PATH, HOME and LANG,
// brings up lo and sets quietKnobs. Every step is best effort; the errors are joined.
func InitSystem(log *slog.Logger) error {
	var errs []error
	for _, m := range systemMounts {
		if err := mountIfAbsent(m); err != nil {
			errs = append(errs, err)
		}
	}
	// /dev/ptmx must lead to the devpts instance mounted above.
	if fi, err := os.Lstat("/dev/ptmx"); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		_ = os.Remove("/dev/ptmx")
		if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
			errs = append(errs, fmt.Errorf("link /dev/ptmx: %w", err))
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		_ = os.Symlink(target, filepath.Join("/dev", name)) // exists already on most systems
	}
	for k, v := range map[string]string{"PATH": DefaultPath, "HOME": DefaultHome, "LANG": DefaultLang} {
		if err := os.Setenv(k, v); err != nil {
			errs = append(errs, fmt.Errorf("set %s: %w", k, err))
		}
	}
	if err := linkUp("lo"); err != nil {
		errs = append(errs, err)
	}
	for _, k := range quietKnobs {
		if err := os.WriteFile(k.path, []byte(k.value), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("set %s: %w", k.path, err))
		}
	}
	if err := (SystemHooks{}).LinkIdentityFiles(); err != nil {
		errs = append(errs, err)
	}
	err := errors.Join(errs...)
	if err != nil {
		log.Error("init system", "err", err)
	}
	return err
}

// mountIfAbsent mounts m unless its target is a mount point already.
func mountIfAbsent(m mountSpec) error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.target, err)
	}
	if mounted, err := isMountPoint(m.target); err != nil || mounted {
		return err
	}
	if err := unix.Mount(m.fstype, m.target, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
	}
	return nil
}

// isMountPoint reports whether p is on another device than its parent (or is /).
func isMountPoint(p string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", p, err)
	}
	if err := unix.Lstat(filepath.Dir(p), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(p), err)
	}
	return st.Dev != parent.Dev || st.Ino == parent.Ino, nil
}

// linkUp sets IFF_UP on the interface name.
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring up %s: %w", name, err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("bring up %s: %w", name, err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up %s: get flags: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up %s: set flags: %w", name, err)
	}
	return nil
}
