// Package failpoint lets tests stop a process at a named point of a
// critical sequence, so that crash recovery can be tested at that exact
// point instead of at a random moment. Points are no-ops unless enabled:
// cmd/panda enables them from the PANDA_FAILPOINTS environment variable
// ("name=action,name=action"), which only tests set. Actions:
//
//	crash  the process kills itself with SIGKILL (a crash: no deferred
//	       code, no cleanup)
//
// A point costs one atomic load when nothing is enabled.
package failpoint

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

var (
	enabled atomic.Bool
	mu      sync.Mutex
	actions map[string]string
)

// Enable parses a PANDA_FAILPOINTS value and enables its points.
func Enable(spec string) error {
	m := map[string]string{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, action, ok := strings.Cut(item, "=")
		if !ok || name == "" {
			return fmt.Errorf("failpoint %q: want name=action", item)
		}
		switch action {
		case "crash":
		default:
			return fmt.Errorf("failpoint %s: unknown action %q (want crash)", name, action)
		}
		m[name] = action
	}
	mu.Lock()
	actions = m
	mu.Unlock()
	enabled.Store(len(m) > 0)
	return nil
}

// Hit runs the action enabled for the point name, if any.
func Hit(name string) {
	if !enabled.Load() {
		return
	}
	mu.Lock()
	action := actions[name]
	mu.Unlock()
	if action == "crash" {
		syscall.Kill(syscall.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not delivered synchronously
	}
}
