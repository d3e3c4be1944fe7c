package host

import (
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// The errors a host reports (wrapped; test with errors.Is), each of a
// class of internal/contract/errs. Where the control plane must tell one
// from another error of its class, it tests for the sentinel; the host
// RPC keeps each sentinel apart (internal/contract/hostwire).
var (
	ErrNotFound = errs.New(errs.NotFound, "not found")
	ErrConflict = errs.New(errs.Conflict, "wrong state")
	ErrInvalid  = errs.New(errs.Invalid, "invalid request")
	ErrNoSpace  = errs.New(errs.NoSpace, "out of disk space")
	// ErrExhausted: a per-host resource for machines (VMM user ids, say)
	// is used up; retry later, or on another host.
	ErrExhausted = errs.New(errs.Unavailable, "host resources exhausted")
	// ErrCorrupt: a capture (snapshot, paused sandbox) failed its checksum
	// and was not restored.
	ErrCorrupt = errs.New(errs.Corrupt, "corrupt")
	// ErrNotReady: the sandbox's guest agent has not answered since the
	// host agent restarted; retry shortly.
	ErrNotReady = errs.New(errs.Unavailable, "guest agent not answering yet")
	// ErrUnavailable: a remote host agent cannot be reached (or is shutting
	// down).
	ErrUnavailable = errs.New(errs.Unavailable, "host agent unavailable")
	// ErrHostShutdown is the cause a sandbox's exit is given when its host
	// agent stopped it because it was shutting down: a reason, of no class.
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
