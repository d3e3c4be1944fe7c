package build

import (
	"context"
	"maps"
	"slices"
	"sync"
)

// slots shares the Manager's build slots (Config.MaxConcurrent) among the
// builds' owners (API keys) fairly. A free slot goes to the waiting build
// whose owner holds the fewest slots; among owners holding as many, to the
// one served least recently; an owner's own builds in the order they
// asked. So an owner with a build running gets no second slot while
// another owner's build waits, owners take turns, and a slot nobody else
// waits for is not left idle. Safe for concurrent use.
type slots struct {
	mu      sync.Mutex
	free    int
	holding map[string]int    // slots held, by owner
	waiting []*waiter         // in the order they asked
	served  map[string]uint64 // round of each owner's last slot, while it holds or waits
	round   uint64
}

// waiter is a build waiting for a slot, then holding it.
type waiter struct {
	owner   string
	granted chan struct{} // closed once it holds a slot
	done    bool          // released, or gave up waiting
}

func newSlots(n int) *slots {
	return &slots{free: n, holding: map[string]int{}, served: map[string]uint64{}}
}

// enqueue puts a build of owner in the queue; it may get a slot at once.
func (s *slots) enqueue(owner string) *waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &waiter{owner: owner, granted: make(chan struct{})}
	s.waiting = append(s.waiting, w)
	s.dispatch()
	return w
}

// wait returns once w holds a slot (nil), or ctx's error once ctx ends
// (w then holds none and has left the queue).
func (s *slots) wait(ctx context.Context, w *waiter) error {
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	s.release(w) // granted meanwhile, or still waiting: either way, gone
	return ctx.Err()
}

// release gives back w's slot, or takes w out of the queue if it holds
// none yet. Idempotent.
func (s *slots) release(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.done {
		return
	}
	w.done = true
	select {
	case <-w.granted:
		s.free++
		if s.holding[w.owner]--; s.holding[w.owner] == 0 {
			delete(s.holding, w.owner)
		}
	default:
		s.waiting = slices.DeleteFunc(s.waiting, func(x *waiter) bool { return x == w })
	}
	s.forget(w.owner)
	s.dispatch()
}

// dispatch gives the free slots to the waiting builds that come first;
// s.mu is held.
func (s *slots) dispatch() {
	for s.free > 0 && len(s.waiting) > 0 {
		best := 0
		for i := 1; i < len(s.waiting); i++ {
			if s.before(s.waiting[i], s.waiting[best]) {
				best = i
			}
		}
		w := s.waiting[best]
		s.waiting = slices.Delete(s.waiting, best, best+1)
		s.free--
		s.holding[w.owner]++
		s.round++
		s.served[w.owner] = s.round
		close(w.granted)
	}
}

// before reports whether waiting build a comes before b (which asked
// earlier than a, or is a itself).
func (s *slots) before(a, b *waiter) bool {
	if ha, hb := s.holding[a.owner], s.holding[b.owner]; ha != hb {
		return ha < hb
	}
	return s.served[a.owner] < s.served[b.owner]
}

// forget drops owner's turn once it neither holds nor waits: an owner
// that comes back later waits behind nobody it would not have; s.mu is
// held.
func (s *slots) forget(owner string) {
	if s.holding[owner] > 0 {
		return
	}
	for _, w := range s.waiting {
		if w.owner == owner {
			return
		}
	}
	delete(s.served, owner)
}

// counts returns the slots held by owner and the builds waiting, for
// tests.
func (s *slots) counts() (holding map[string]int, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.holding), len(s.waiting)
}
