package pandastack

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// Event types (Event.Type).
const (
	EventSandbox         = "sandbox"          // a sandbox's record changed: Sandbox holds it
	EventSandboxDeleted  = "sandbox_deleted"  // a sandbox stopped (StopReason) or a failed create's record went
	EventSnapshot        = "snapshot"         // a snapshot was taken: Snapshot holds it
	EventSnapshotDeleted = "snapshot_deleted" // a snapshot was deleted
	// EventOverflow: the stream fell too far behind and ends after it;
	// list again and open a new stream.
	EventOverflow = "overflow"
)

// Event is one line of the event stream (Client.Events).
type Event struct {
	Seq  uint64    `json:"seq"` // increases by one per event of the server process (0 on overflow)
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	ID   string    `json:"id,omitempty"` // the sandbox's or snapshot's
	// Sandbox is an EventSandbox's record, as Get returns it but without
	// Memory, Stored and StoreError.
	Sandbox *SandboxInfo `json:"sandbox,omitempty"`
	// Snapshot is an EventSnapshot's, without Stored and StoreError.
	Snapshot *Snapshot `json:"snapshot,omitempty"`
	// StopReason is an EventSandboxDeleted's: why it stopped ("" for a
	// create that failed).
	StopReason string `json:"stop_reason,omitempty"`
}

// EventStream is an open event stream (Client.Events). Next is for one
// goroutine; Close may be called from any.
type EventStream struct {
	// Seq is the number of the last event before the stream began: the
	// events Next returns are the later ones.
	Seq uint64

	body io.ReadCloser
	sc   *bufio.Scanner
	idle *time.Timer // closes body when the server has been silent too long

	mu       sync.Mutex
	timedOut bool
}

// EventsIdleTimeout is how long an event stream may carry nothing, not
// even the server's ping (every 15 s), before Next gives up on it.
const EventsIdleTimeout = 45 * time.Second

// Events opens the stream of the changes of the key's sandboxes and
// snapshots, and returns once the server has subscribed it: list after
// that (List, Snapshots) and apply the events to the list, and nothing is
// missed. Read them with Next; Close (or ctx) ends the stream. The stream
// ends when the key is revoked or the server shuts down (Next returns
// io.EOF), or after an EventOverflow if the reader fell behind.
func (c *Client) Events(ctx context.Context) (*EventStream, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path("events"), nil, nil, "")
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	s := &EventStream{body: resp.Body, sc: sc}
	s.idle = time.AfterFunc(time.Hour, func() {
		s.mu.Lock()
		s.timedOut = true
		s.mu.Unlock()
		s.body.Close()
	})
	s.idle.Stop() // armed only while line waits
	hello, err := s.line()
	if err == nil && hello.Type != "hello" {
		err = fmt.Errorf("events: first line is %q, want hello", hello.Type)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	s.Seq = hello.Seq
	return s, nil
}

// line reads the next line, pings included. The server sends at least a
// ping every 15 s: a wait of EventsIdleTimeout closes the stream.
func (s *EventStream) line() (Event, error) {
	s.idle.Reset(EventsIdleTimeout)
	ok := s.sc.Scan()
	s.idle.Stop()
	if !ok {
		err := s.sc.Err()
		s.mu.Lock()
		timedOut := s.timedOut
		s.mu.Unlock()
		switch {
		case timedOut:
			err = fmt.Errorf("events: nothing from the server for %s: %w", EventsIdleTimeout, ErrUnavailable)
		case err == nil:
			err = io.EOF
		}
		return Event{}, err
	}
	var ev Event
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return Event{}, fmt.Errorf("events: malformed line: %w", err)
	}
	return ev, nil
}

// Next returns the next event (pings are skipped); io.EOF when the
// server ended the stream, or the read's error (the context's after Close
// or when ctx ended; ErrUnavailable when the server stayed silent for
// EventsIdleTimeout).
func (s *EventStream) Next() (Event, error) {
	for {
		ev, err := s.line()
		if err != nil || ev.Type != "ping" {
			return ev, err
		}
	}
}

// Close ends the stream.
func (s *EventStream) Close() error {
	s.idle.Stop()
	err := s.body.Close()
	if errors.Is(err, http.ErrBodyReadAfterClose) {
		err = nil
	}
	return err
}

// CommandRecord is one command of a sandbox's history (Sandbox.Commands).
type CommandRecord struct {
	N       int64  `json:"n"`    // its number in the sandbox's history, from 1
	Kind    string `json:"kind"` // "exec", "process" or "pty"
	Command string `json:"command"`
	PID     int    `json:"pid,omitempty"` // a process's or pty's
	// FinishedAt, ExitCode and DurationMS are nil while it runs, or when
	// its end is unknown.
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	ExitCode   *int       `json:"exit_code"`
	Signal     string     `json:"signal,omitempty"`
	DurationMS *int64     `json:"duration_ms"`
}

// Commands returns the last 100 commands run in the sandbox through the
// API (Exec, ExecStream, StartProcess), oldest first. The server keeps
// them in memory: they are gone after it restarts, and when the sandbox
// stops. Neither stdin nor env values are kept.
func (s *Sandbox) Commands(ctx context.Context) ([]CommandRecord, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	var out struct {
		Commands []CommandRecord `json:"commands"`
	}
	err := s.c.doJSON(ctx, http.MethodGet, path("sandboxes", s.ID, "commands"), nil, nil, &out)
	return out.Commands, err
}
