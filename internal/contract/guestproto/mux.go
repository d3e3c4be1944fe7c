package guestproto

import (
	"encoding/json"
	"sync"
)

// mux is the state both ends share: the stream table and the writer. The
// read loop that feeds it belongs to Agent (guest) or Client (host).
type mux struct {
	host bool
	w    *frameWriter

	mu      sync.Mutex
	streams map[uint32]*Stream
	dials   int // of streams, the dial streams (host side)
}

func newMux(host bool, w *frameWriter) *mux {
	return &mux{host: host, w: w, streams: make(map[uint32]*Stream)}
}

// add registers a new stream; it returns nil if the id is taken. With
// limit > 0 it fails with CodeBusy when limit streams of its kind are
// open: dial streams (dial) and the others are counted apart, so that
// connections to the guest's ports cannot starve its execs and file
// operations, nor they them.
func (m *mux) add(id uint32, gen uint64, limit int, dial bool) (*Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case limit <= 0:
	case dial && m.dials >= limit:
		return nil, Errorf(CodeBusy, "too many connections to this sandbox's ports at once (at most %d); retry when one has closed", limit)
	case !dial && len(m.streams)-m.dials >= limit:
		return nil, Errorf(CodeBusy, "too many concurrent operations on this sandbox (at most %d at once); retry when one has finished", limit)
	}
	if _, ok := m.streams[id]; ok {
		return nil, nil
	}
	s := newStream(m, id, gen)
	s.dial = dial
	m.streams[id] = s
	if dial {
		m.dials++
	}
	return s, nil
}

func (m *mux) lookup(id uint32) *Stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streams[id]
}

// remove drops s from the table if it is still there.
func (m *mux) remove(s *Stream) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.streams[s.id] == s {
		delete(m.streams, s.id)
		if s.dial {
			m.dials--
		}
	}
}

// count returns the number of streams in the table.
func (m *mux) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.streams)
}

// abortAll ends every stream with err and empties the table.
func (m *mux) abortAll(err error) {
	m.mu.Lock()
	all := m.streams
	m.streams = make(map[uint32]*Stream)
	m.dials = 0
	m.mu.Unlock()
	for _, s := range all {
		s.abort(err, nil)
	}
}

// streamFrame handles the frame types both ends treat alike: DATA, WINDOW,
// CLOSE and RESET. Frames for unknown streams are dropped: they belong to
// streams this side already ended.
func (m *mux) streamFrame(f Frame) {
	s := m.lookup(f.Stream)
	if s == nil {
		return
	}
	switch f.Type {
	case FrameData:
		if err := s.onData(f.Flags, f.Payload); err != nil {
			s.abort(&Error{Code: CodeInternal, Message: err.Error()}, &Error{Code: CodeInvalid, Message: err.Error()})
		}
	case FrameWindow:
		if err := s.onWindow(f.Flags, f.Payload); err != nil {
			s.abort(&Error{Code: CodeInternal, Message: err.Error()}, &Error{Code: CodeInvalid, Message: err.Error()})
		}
	case FrameClose:
		if s.onClose() && m.host {
			// The guest's CLOSE is its last frame: the stream is over
			// (a dial stream's once the host has sent its CLOSE too).
			s.detach()
		}
	case FrameReset:
		e := &Error{Code: CodeCanceled, Message: "stream reset by peer"}
		if len(f.Payload) > 0 {
			var pe Error
			if err := json.Unmarshal(f.Payload, &pe); err == nil && pe.Code != "" {
				e = &pe
			}
		}
		s.abort(e, nil)
	}
}
