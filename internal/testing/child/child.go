// Package child starts child processes that the kernel stops when this
// process dies (the parent-death signal, PR_SET_PDEATHSIG), reliably.
//
// Linux ties that signal to the thread that forked the child, not to the
// process: if that thread ever exits, the child gets the signal while its
// parent lives on. Go ends a thread whenever a goroutine that locked it
// (runtime.LockOSThread, as code that enters namespaces does) returns
// without unlocking, and any goroutine can land on the thread that forked
// a child. So Start forks from a goroutine that keeps its thread locked
// until the child has exited: no other goroutine runs on it meanwhile,
// and it cannot end early.
package child

import (
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with the parent-death signal sig (its SysProcAttr is
// kept, or made) and returns a channel that receives cmd.Wait's result
// when it exits. Do not call cmd.Wait yourself. One OS thread per running
// child stays blocked in wait4.
func Start(cmd *exec.Cmd, sig syscall.Signal) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		runtime.UnlockOSThread()
		done <- err
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}
