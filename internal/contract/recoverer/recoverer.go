// Package recoverer is the HTTP middleware that turns a handler's panic
// into an error answer, shared by the REST API (package api) and the host
// API (package hostapi), each of which writes errors its own way.
package recoverer

import (
	"fmt"
	"log/slog"
	"net/http"
)

// New returns middleware that turns a handler panic into reply's error
// answer (a 500) instead of a dropped connection, and logs it: a panic is a
// bug. http.ErrAbortHandler still aborts.
func New(log *slog.Logger, reply func(w http.ResponseWriter, r *http.Request, err error)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					if v == http.ErrAbortHandler {
						panic(v)
					}
					log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
					reply(w, r, fmt.Errorf("panic: %v", v))
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}
