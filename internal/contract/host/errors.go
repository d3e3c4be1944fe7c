package host

import (
	"errors"
	"fmt"
)

// The error classes a host reports (wrapped; test with errors.Is). The
// control plane turns them into what users see.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("wrong state")
	ErrInvalid  = errors.New("invalid request")
	ErrNoSpace  = errors.New("out of disk space")
	// ErrExhausted: a per-host resource for machines (VMM user ids, say)
	// is used up; retry later, or on another host.
	ErrExhausted = errors.New("host resources exhausted")
	// ErrCorrupt: a capture (snapshot, paused sandbox) failed its checksum
	// and was not restored.
	ErrCorrupt = errors.New("corrupt")
	// ErrNotReady: the sandbox's guest agent has not answered since the
	// host agent restarted; retry shortly.
	ErrNotReady = errors.New("guest agent not answering yet")
	// ErrUnavailable: a remote host agent cannot be reached (or is shutting
	// down).
	ErrUnavailable = errors.New("host agent unavailable")
	// ErrHostShutdown is the cause a sandbox's exit is given when its host
	// agent stopped it because it was shutting down.
	ErrHostShutdown = errors.New("host agent shut down")
)

// UnreachableError is a failure to talk to a host agent at all (it is
// ErrUnavailable): its text names the agent's address and the transport's
// error, for the control plane's logs; users are only told that a host
// cannot be reached, never where it is.
type UnreachableError struct {
	Addr string // the agent's URL
	Err  error  // the transport's error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%v: %s: %v", ErrUnavailable, e.Addr, e.Err)
}

func (e *UnreachableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }
