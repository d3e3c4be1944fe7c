package api

import (
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/control"
)

// limiter counts requests in flight per sandbox and per key and refuses
// those over the limits (<= 0: unlimited). what names the requests it
// counts, in its refusals.
type limiter struct {
	maxSandbox, maxKey int
	what               string

	mu        sync.Mutex
	sandboxes map[string]int
	keys      map[string]int
}

func newLimiter(maxSandbox, maxKey int, what string) *limiter {
	return &limiter{maxSandbox: maxSandbox, maxKey: maxKey, what: what, sandboxes: map[string]int{}, keys: map[string]int{}}
}

// acquire takes one slot for sandbox sb of key k, or returns a 429 error.
func (l *limiter) acquire(sb, k string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.maxSandbox > 0 && l.sandboxes[sb] >= l.maxSandbox {
		return nil, tooMany("sandbox %s has %d requests in flight (%s), the most allowed at once; wait for some to finish", sb, l.maxSandbox, l.what)
	}
	if l.maxKey > 0 && l.keys[k] >= l.maxKey {
		return nil, tooMany("this API key has %d requests in flight to its sandboxes (%s), the most allowed at once; wait for some to finish", l.maxKey, l.what)
	}
	l.sandboxes[sb]++
	l.keys[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.sandboxes[sb]--; l.sandboxes[sb] == 0 {
				delete(l.sandboxes, sb)
			}
			if l.keys[k]--; l.keys[k] == 0 {
				delete(l.keys, k)
			}
		})
	}, nil
}

func tooMany(format string, args ...any) *control.Error {
	return errorf(control.TooManyRequests, format, args...)
}

// limitGuest is middleware for requests that hold a guest stream.
func (s *Server) limitGuest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, err := s.guests.acquire(chi.URLParam(r, "id"), callerOf(r).Key.ID)
		if err != nil {
			drain(r.Body)
			s.writeError(w, r, err)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// outputBudget bounds the bytes all buffered execs hold together.
type outputBudget struct {
	max  int64
	used atomic.Int64
}

// take reserves n bytes, or reports that the budget is spent.
func (b *outputBudget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *outputBudget) give(n int64) { b.used.Add(-n) }
