// Package osthread runs a function on an OS thread of its own that is
// thrown away afterwards, for changes to a thread that must not outlive
// the call: joining a network namespace (setns), unsharing a mount
// namespace, changing root or credentials. The VMM's jail and the
// network's namespace calls share it.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Disposable runs fn on an OS thread of its own that is discarded
// afterwards: fn may change the thread's namespaces, root and credentials.
// The goroutine running fn returns without unlocking the thread, and the
// Go runtime then terminates it instead of running anything else on it.
//
// Except the main thread, which the runtime cannot terminate: it wedges
// it, and the process's /proc/self (mountinfo, ns/net, ns/mnt, ...) would
// then show what fn joined, which would also stay referenced, never freed.
// So fn never runs on the main thread: a goroutine that finds itself there
// keeps it locked (so that no other goroutine can get it) while a second
// goroutine, necessarily on another thread, runs fn; then it gives the
// main thread back, unchanged.
func Disposable(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			errc <- fn()
			return
		}
		inner := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			inner <- fn()
		}()
		err := <-inner
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}
