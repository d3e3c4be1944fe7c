package rest

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/events"
)

// eventJSON is a line of GET /v1/events (docs/api.md, "Events").
type eventJSON struct {
	Seq  *uint64   `json:"seq,omitempty"`
	Time time.Time `json:"time"`
	Type string    `json:"type"`
	ID   string    `json:"id,omitempty"`
	// Sandbox is a "sandbox" event's record as GET /v1/sandboxes/{id}
	// shows it, without its live fields (memory, stored, store_error).
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	// Snapshot is a "snapshot" event's, as GET /v1/snapshots/{id} shows
	// it, without stored and store_error.
	Snapshot *snapshotJSON `json:"snapshot,omitempty"`
	// StopReason is a "sandbox_deleted" event's: why it stopped, if it
	// did (a create that failed has none).
	StopReason string `json:"stop_reason,omitempty"`
}

// DefaultMaxEventStreamsPerKey is Config.MaxEventStreamsPerKey's
// default.
const DefaultMaxEventStreamsPerKey = 8

// eventWriteTimeout bounds one write of an event stream: a client that
// stopped reading is cut off instead of holding its handler forever.
const eventWriteTimeout = 30 * time.Second

// streamEvents streams the changes of the caller's sandboxes and snapshots
// as NDJSON until the client goes away, the key is revoked, the server
// shuts down or the client falls behind ({"type":"overflow"}, then the
// end). The first line, "hello", is sent once the subscription is in
// place: a client that lists after it misses nothing. A key has at most
// Config.MaxEventStreamsPerKey streams open at once (429 beyond).
func (s *Server) streamEvents(w http.ResponseWriter, r *http.Request) {
	key := callerOf(r).Key
	release, ok := s.streams.take(key.ID)
	if !ok {
		s.writeError(w, r, tooMany("this API key has %d event streams open, the most allowed at once; close one first", s.cfg.MaxEventStreamsPerKey))
		return
	}
	defer release()
	sub, seq, err := s.events.Subscribe(key.ID, s.cfg.EventBuffer)
	if err != nil {
		s.writeError(w, r, errorf(controlplane.Unavailable, "the server is shutting down"))
		return
	}
	defer sub.Close()
	// A revoke between the authentication and the subscription would
	// find no stream to close.
	if k, err := s.cat.GetKey(r.Context(), key.ID); err != nil || k.Revoked() {
		s.writeError(w, r, errorf(controlplane.Unauthorized, "unknown or revoked API key"))
		return
	}
	out := newNDJSON(w)
	send := func(ev eventJSON) bool {
		out.rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		return out.send(ev) == nil
	}
	if !send(eventJSON{Type: "hello", Seq: &seq, Time: time.Now().UTC()}) {
		return
	}
	ping := time.NewTicker(s.cfg.EventPing)
	defer ping.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ping.C:
			if !send(eventJSON{Type: "ping", Time: time.Now().UTC()}) {
				return
			}
		case ev, ok := <-sub.Events():
			if !ok {
				if errors.Is(sub.Err(), events.ErrOverflow) {
					send(eventJSON{Type: "overflow", Time: time.Now().UTC()})
				}
				return
			}
			if !send(s.eventLine(r.Context(), ev)) {
				return
			}
		}
	}
}

// eventLine is ev as a line of the stream.
func (s *Server) eventLine(ctx context.Context, ev events.Event) eventJSON {
	seq := ev.Seq
	out := eventJSON{Seq: &seq, Time: ev.Time, Type: ev.Type, ID: ev.ID}
	switch d := ev.Data.(type) {
	case catalog.Sandbox:
		if ev.Type == controlplane.EventSandboxDeleted {
			out.StopReason = d.StopReason
			break
		}
		sb := s.toJSON(d)
		if s.hostLost(d) {
			sb.State = StateLost
		}
		out.Sandbox = &sb
	case catalog.Snapshot:
		if ev.Type == controlplane.EventSnapshot {
			sn := snapToJSON(d, nil)
			out.Snapshot = &sn
		}
	}
	return out
}

// CloseStreams ends the event streams (the server is shutting down: its
// HTTP server's Shutdown would wait for them). Later ones are refused.
func (s *Server) CloseStreams() { s.events.Close() }

// commandJSON is an entry of GET /v1/sandboxes/{id}/commands.
type commandJSON struct {
	N          int64      `json:"n"`
	Kind       string     `json:"kind"`
	Command    string     `json:"command"`
	PID        int        `json:"pid,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	ExitCode   *int       `json:"exit_code"`
	Signal     string     `json:"signal,omitempty"`
	DurationMS *int64     `json:"duration_ms"`
}

// listCommands answers the caller's sandbox's command history, oldest
// first. The ends of background processes that the server has not seen
// yet are asked of the guest first (one list of its processes).
func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) {
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cmds := s.cp.Commands(sb.ID)
	if sb.State == catalog.StateRunning && processRunning(cmds) {
		if g, err := s.host.Guest(r.Context(), sb.ID); err == nil {
			if pg, ok := g.(host.ProcessGuest); ok {
				if ps, err := pg.ListProcesses(r.Context()); err == nil {
					s.noteProcesses(sb.ID, ps...)
					cmds = s.cp.Commands(sb.ID)
				}
			}
		}
	}
	out := make([]commandJSON, 0, len(cmds))
	for _, c := range cmds {
		j := commandJSON{N: c.N, Kind: c.Kind, Command: c.Line, PID: c.PID, StartedAt: c.StartedAt,
			ExitCode: c.ExitCode, Signal: c.Signal, DurationMS: c.DurationMS}
		if !c.FinishedAt.IsZero() {
			j.FinishedAt = &c.FinishedAt
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, map[string]any{"commands": out})
}

// processRunning reports whether cmds hold a background process whose end
// is not known.
func processRunning(cmds []controlplane.Command) bool {
	for _, c := range cmds {
		if c.Kind != controlplane.CommandExec && c.FinishedAt.IsZero() {
			return true
		}
	}
	return false
}
