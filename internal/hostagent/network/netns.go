package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"github.com/pandastack/pandastack/internal/hostagent/internal/osthread"
	"golang.org/x/sys/unix"
)

// NetnsDir is where named network namespaces live (as for `ip netns`).
const NetnsDir = "/run/netns"

// inNetns runs fn on an OS thread that has joined the network namespace
// fd refers to (osthread.Disposable): the thread is never handed back to
// the Go scheduler, so no other goroutine ever runs in the wrong
// namespace, whatever fn did, and it is never the main thread, which would
// stay in the namespace for good (keeping it alive after its sandbox).
// Sockets fn creates stay in that namespace and may be used from any
// goroutine afterwards.
func inNetns(fd int, fn func() error) error {
	return osthread.Disposable(func() error {
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns: %w", err)
		}
		return fn()
	})
}

// EnsureNetnsDir makes NetnsDir exist and be a shared mount point, as `ip
// netns add` does, so that unmounting a namespace there also unmounts its
// copies in mount namespaces made since (a confined VMM's, say). Every
// namespace bound in NetnsDir must be bound after it ran: it makes
// NetnsDir a mount of itself when it is not a mount point yet, and a
// namespace bound there before would be hidden under that mount, where
// no path reaches it to unbind it (its file then cannot be removed:
// "device or resource busy").
func EnsureNetnsDir() error {
	if err := os.MkdirAll(NetnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(NetnsDir, NetnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", NetnsDir, err)
		}
		err = unix.Mount("", NetnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", NetnsDir, err)
	}
	return nil
}

// createNetns makes a new network namespace bound at NetnsDir/name and
// runs setup on a thread inside it. It fails with os.ErrExist if the name
// is taken. On failure nothing is left.
func createNetns(name string, setup func() error) error {
	path := filepath.Join(NetnsDir, name)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread leaves the host namespace for good.
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
		if err != nil {
			errc <- err
			return
		}
		f.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			os.Remove(path)
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			os.Remove(path)
			errc <- fmt.Errorf("bind %s: %w", path, err)
			return
		}
		if err := setup(); err != nil {
			removeNetns(name)
			errc <- err
			return
		}
		errc <- nil
	}()
	return <-errc
}

// removeNetns unbinds and removes NetnsDir/name. The namespace itself goes
// away when nothing else holds it (an open descriptor, a socket, a
// process). A missing name is not an error.
func removeNetns(name string) error {
	return UnbindNetns(filepath.Join(NetnsDir, name))
}

// UnbindNetns unbinds the namespace bound at path and removes the file. A
// missing path is not an error.
func UnbindNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		if errors.Is(err, unix.EBUSY) {
			// See EnsureNetnsDir: bound before NetnsDir became a mount
			// point, by a PandaStack before 2026-12-02 or another tool.
			return fmt.Errorf("%w (the namespace is bound under the mount of %s over itself, where no path reaches it: with no namespace in use there, `umount %s` uncovers it and `ip netns delete` then removes it; or reboot)", err, NetnsDir, NetnsDir)
		}
		return err
	}
	return nil
}

// openNetns opens a namespace by path for setns and netlink.
func openNetns(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil || (st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a network namespace", path)
	}
	return fd, nil
}

// netnsDialer makes connections and listeners in one namespace. A
// negative fd means the calling thread's own namespace.
type netnsDialer struct {
	fd int
}

func (d netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	if d.fd < 0 {
		return nd.DialContext(ctx, network, addr)
	}
	var c net.Conn
	err := inNetns(d.fd, func() (err error) {
		c, err = nd.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func (d netnsDialer) listen(fn func() error) error {
	if d.fd < 0 {
		return fn()
	}
	return inNetns(d.fd, fn)
}
