package host

import "errors"

// The error classes a host reports (wrapped; test with errors.Is). The
// control plane turns them into what users see.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("wrong state")
	ErrInvalid  = errors.New("invalid request")
	ErrNoSpace  = errors.New("out of disk space")
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
