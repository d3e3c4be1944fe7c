// Package lifecycle is the one vocabulary of a sandbox's life: its states
// and the transitions between them. The host agent (one sandbox's VMM and
// files) and the control plane (its catalog record) each keep a sandbox in
// one of these states and change it only through Next, so that both agree
// on what may follow what and a transition nobody planned is an error, not
// a silent overwrite.
//
//	             create                     pause                 (done)
//	(none) ──► starting ──► running ──────────────► pausing ──────────► paused
//	               │          ▲  │ ▲                   │ (failed)         │  ▲
//	               │          │  │ └───────────────────┘                  │  │ (failed)
//	               │          │  │                                 resume │  │
//	               │          │  └── snapshot, fork: no state change      ▼  │
//	               │          └──────────────────────────────────────── resuming
//	               ▼                 (done)
//	every state ──► stopping ──► stopped (final)
//
// A sandbox is *live* in every state but stopped. Long operations (pause,
// resume) have a state of their own so that a crash in the middle is
// visible afterwards and can be finished or rolled back; snapshot and fork
// capture a running sandbox and leave it running.
package lifecycle

import "fmt"

// State is where a sandbox is in its life.
type State string

// The states. Stopped is final.
const (
	Starting State = "starting" // being restored; not usable yet
	Running  State = "running"  // its VMM runs; commands and files work
	Pausing  State = "pausing"  // being captured to disk; its VMM then stops
	Paused   State = "paused"   // on disk only: no VMM, no memory
	Resuming State = "resuming" // being restored from its pause capture
	Stopping State = "stopping" // its VMM and files are being removed
	Stopped  State = "stopped"  // gone; only the record is left
)

// States lists every state, in life order.
var States = []State{Starting, Running, Pausing, Paused, Resuming, Stopping, Stopped}

// Live are the states of a sandbox that exists (every one but Stopped).
var Live = []State{Starting, Running, Pausing, Paused, Resuming, Stopping}

// Valid reports whether s is one of the states.
func (s State) Valid() bool {
	for _, x := range States {
		if x == s {
			return true
		}
	}
	return false
}

// Event is what happens to a sandbox.
type Event string

// The events.
const (
	Started      Event = "started"       // starting → running
	Pause        Event = "pause"         // running → pausing
	PauseDone    Event = "pause_done"    // pausing → paused
	PauseFailed  Event = "pause_failed"  // pausing → running (the capture is discarded)
	Resume       Event = "resume"        // paused → resuming
	ResumeDone   Event = "resume_done"   // resuming → running
	ResumeFailed Event = "resume_failed" // resuming → paused (the capture is kept)
	Stop         Event = "stop"          // any live state → stopping
	StopDone     Event = "stop_done"     // stopping → stopped; also starting → stopped when a create fails
)

var table = map[State]map[Event]State{
	Starting: {Started: Running, Stop: Stopping, StopDone: Stopped},
	Running:  {Pause: Pausing, Stop: Stopping},
	Pausing:  {PauseDone: Paused, PauseFailed: Running, Stop: Stopping},
	Paused:   {Resume: Resuming, Stop: Stopping},
	Resuming: {ResumeDone: Running, ResumeFailed: Paused, Stop: Stopping},
	Stopping: {StopDone: Stopped},
}

// TransitionError says an event cannot happen in a state.
type TransitionError struct {
	From  State
	Event Event
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("sandbox is %s: cannot %s", e.From, e.Event)
}

// Next is the state that follows from on ev, or a *TransitionError.
func Next(from State, ev Event) (State, error) {
	if to, ok := table[from][ev]; ok {
		return to, nil
	}
	return from, &TransitionError{From: from, Event: ev}
}

// Can reports whether ev can happen in state from.
func Can(from State, ev Event) bool {
	_, err := Next(from, ev)
	return err == nil
}
