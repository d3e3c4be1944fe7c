package guest

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// Reaper starts child processes and collects their exit statuses from one
// SIGCHLD-driven wait4 loop.
//
// In reap-all mode (PID 1, or a child subreaper) it waits for any child:
// statuses of processes it started go to their waiters, those of orphans
// re-parented to us are discarded. Otherwise it waits only for the pids it
// started, leaving other children of the process alone.
//
// Start holds the lock from fork until the pid is registered, and the loop
// takes it before looking a reaped pid up, so a child that exits at once is
// never mistaken for an orphan.
type Reaper struct {
	all bool
	sig chan os.Signal

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

// NewReaper returns a reaper; all selects reap-all mode. It subscribes to
// SIGCHLD at once, so no exit is missed before Run starts.
func NewReaper(all bool) *Reaper {
	r := &Reaper{all: all, sig: make(chan os.Signal, 1), waiters: make(map[int]chan syscall.WaitStatus)}
	signal.Notify(r.sig, syscall.SIGCHLD)
	return r
}

// Run reaps until ctx ends.
func (r *Reaper) Run(ctx context.Context) {
	defer signal.Stop(r.sig)
	for {
		r.reap()
		select {
		case <-ctx.Done():
			return
		case <-r.sig:
		}
	}
}

// Start forks and execs argv0 and returns its pid and a channel that receives
// its wait status once.
func (r *Reaper) Start(argv0 string, argv []string, attr *syscall.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	ch := make(chan syscall.WaitStatus, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := syscall.ForkExec(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *Reaper) reap() {
	if !r.all {
		r.mu.Lock()
		defer r.mu.Unlock()
		for pid, ch := range r.waiters {
			var ws syscall.WaitStatus
			got, err := wait4(pid, &ws)
			if got == pid || errors.Is(err, syscall.ECHILD) {
				delete(r.waiters, pid)
				ch <- ws
			}
		}
		return
	}
	for {
		var ws syscall.WaitStatus
		pid, err := wait4(-1, &ws)
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- ws
		}
		r.mu.Unlock()
	}
}

func wait4(pid int, ws *syscall.WaitStatus) (int, error) {
	for {
		got, err := syscall.Wait4(pid, ws, syscall.WNOHANG, nil)
		if !errors.Is(err, syscall.EINTR) {
			return got, err
		}
	}
}
