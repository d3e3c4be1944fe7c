// Package events is the fan-out of the control plane's record changes to
// live subscribers (GET /v1/events): a Hub numbers each published event
// and hands it to the subscriptions of the API key it belongs to, each
// through a bounded buffer. Publishing never blocks: a subscriber that
// falls a buffer behind is dropped (ErrOverflow) and re-lists. It knows
// nothing of HTTP nor of what an event carries.
package events

import (
	"errors"
	"sync"
	"time"
)

// Event is one change, as published.
type Event struct {
	Seq  uint64    // set by Publish: increases by one per event of the hub
	Time time.Time // set by Publish (UTC)
	Type string    // e.g. "sandbox", "sandbox_deleted", "snapshot", "snapshot_deleted"
	ID   string    // the sandbox's or snapshot's id
	Key  string    // the API key whose subscriptions see it
	Data any       // what changed (the record); opaque to the hub
}

// Why a subscription ended, as Sub.Err reports it.
var (
	// ErrOverflow: the subscriber fell a whole buffer behind.
	ErrOverflow = errors.New("subscriber fell behind")
	// ErrRevoked: the subscription's key was revoked (CloseKey).
	ErrRevoked = errors.New("api key revoked")
	// ErrClosed: the hub closed (server shutdown), or Sub.Close.
	ErrClosed = errors.New("event hub closed")
)

// DefaultBuffer is the events a subscriber may be behind by default.
const DefaultBuffer = 256

// Hub is the set of subscriptions. The zero value is not usable: New.
// A nil *Hub accepts Publish and CloseKey and does nothing. Safe for
// concurrent use.
type Hub struct {
	now func() time.Time

	mu     sync.Mutex
	seq    uint64
	subs   map[*Sub]struct{}
	closed bool
}

// New returns a hub; now is its clock (nil: time.Now).
func New(now func() time.Time) *Hub {
	if now == nil {
		now = time.Now
	}
	return &Hub{now: now, subs: map[*Sub]struct{}{}}
}

// Sub is one subscription: Events delivers its key's events in order
// until it is closed, then Err says why.
type Sub struct {
	hub *Hub
	key string
	c   chan Event
	err error // set, under hub.mu, when c is closed
}

// Subscribe subscribes to key's events with a buffer of n (<= 0:
// DefaultBuffer). seq is the sequence number of the last event published
// before the subscription: every later one is delivered. ErrClosed if the
// hub is closed.
func (h *Hub) Subscribe(key string, n int) (sub *Sub, seq uint64, err error) {
	if n <= 0 {
		n = DefaultBuffer
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, 0, ErrClosed
	}
	s := &Sub{hub: h, key: key, c: make(chan Event, n)}
	h.subs[s] = struct{}{}
	return s, h.seq, nil
}

// Events is the subscription's channel: closed when it ends (what is
// buffered is delivered first).
func (s *Sub) Events() <-chan Event { return s.c }

// Err is why the subscription ended (ErrOverflow, ErrRevoked, ErrClosed),
// or nil while it lasts.
func (s *Sub) Err() error {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Close ends the subscription (its subscriber went away). Idempotent.
func (s *Sub) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.end(s, ErrClosed)
}

// end removes s with err as the reason, if it is still subscribed. Called
// with h.mu held.
func (h *Hub) end(s *Sub, err error) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	s.err = err
	close(s.c)
}

// Publish numbers ev, stamps it with the time and hands it to the
// subscriptions of ev.Key; one whose buffer is full is ended with
// ErrOverflow. It never blocks on a subscriber.
func (h *Hub) Publish(ev Event) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.seq++
	ev.Seq, ev.Time = h.seq, h.now().UTC()
	for s := range h.subs {
		if s.key != ev.Key {
			continue
		}
		select {
		case s.c <- ev:
		default:
			h.end(s, ErrOverflow)
		}
	}
}

// CloseKey ends the subscriptions of key with ErrRevoked.
func (h *Hub) CloseKey(key string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if s.key == key {
			h.end(s, ErrRevoked)
		}
	}
}

// Close ends every subscription with ErrClosed and refuses new ones;
// later events are dropped. Idempotent.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		h.end(s, ErrClosed)
	}
}

// Len is the number of subscriptions.
func (h *Hub) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// KeyLen is the number of subscriptions of key.
func (h *Hub) KeyLen(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for s := range h.subs {
		if s.key == key {
			n++
		}
	}
	return n
}
