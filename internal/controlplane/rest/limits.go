package rest

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
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

// perKey counts something each key holds (event streams) and refuses
// more than max of it (<= 0: unlimited).
type perKey struct {
	max int

	mu sync.Mutex
	n  map[string]int
}

func newPerKey(max int) *perKey { return &perKey{max: max, n: map[string]int{}} }

// take takes one for key k; false when k holds max already.
func (p *perKey) take(k string) (release func(), ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > 0 && p.n[k] >= p.max {
		return nil, false
	}
	p.n[k]++
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.n[k]--; p.n[k] == 0 {
				delete(p.n, k)
			}
		})
	}, true
}

func tooMany(format string, args ...any) *controlplane.Error {
	return errorf(controlplane.TooManyRequests, format, args...)
}

// guestSandboxKey is the request context's key of the sandbox limitGuest
// resolved.
type guestSandboxKey struct{}

// limitGuest is middleware for requests that hold a guest stream (exec,
// files, watch, ports, processes, tty). In this order, so that one key
// cannot spend another's slots: it resolves the caller's running sandbox
// of the URL (another key's sandbox is 404, exactly like an unknown one),
// then takes a slot of the sandbox and of the key, and only then runs the
// handler, which may read the body; the handler finds the sandbox with
// guestSandbox, without looking it up again. A refusal reads nothing of
// the body (refuse).
func (s *Server) limitGuest(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sb, err := s.running(r)
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		release, err := s.guests.acquire(sb.ID, callerOf(r).Key.ID)
		if err != nil {
			s.refuse(w, r, err)
			return
		}
		defer release()
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), guestSandboxKey{}, sb)))
	})
}

// guestSandbox is the caller's running sandbox of r's URL: the one
// limitGuest resolved (as it was then: the guest says if it has stopped
// since), or, for a request that did not pass limitGuest, looked up now.
func (s *Server) guestSandbox(r *http.Request) (catalog.Sandbox, error) {
	if sb, ok := r.Context().Value(guestSandboxKey{}).(catalog.Sandbox); ok {
		return sb, nil
	}
	return s.running(r)
}

// refuse answers err to a request whose body it has not read and will
// not read: the connection is closed after the answer instead of being
// drained for reuse, so that a slow or endless body costs the server
// nothing more (net/http would otherwise read up to 256 KiB of it before
// answering).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
	s.writeError(w, r, err)
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
