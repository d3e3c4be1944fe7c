package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/pandastack/pandastack/internal/control"
)

// The REST API answers errors as {"error": {"code": ..., "message": ...}}:
// the code is the error's control.Kind, the message its user message. The
// control plane and the handlers return *control.Error (or internal errors
// that control.Classify classifies); this file is the one place where a
// kind becomes an HTTP status.

// statuses is the HTTP status of each kind; E2B's API (e2b.go) answers
// with the same ones.
var statuses = map[control.Kind]int{
	control.BadRequest:       http.StatusBadRequest,
	control.Unauthorized:     http.StatusUnauthorized,
	control.Forbidden:        http.StatusForbidden,
	control.NotFound:         http.StatusNotFound,
	control.MethodNotAllowed: http.StatusMethodNotAllowed,
	control.Conflict:         http.StatusConflict,
	control.Corrupt:          http.StatusConflict,
	control.TooLarge:         http.StatusRequestEntityTooLarge,
	control.Invalid:          http.StatusUnprocessableEntity,
	control.QuotaExceeded:    http.StatusTooManyRequests,
	control.TooManyRequests:  http.StatusTooManyRequests,
	control.TemplateLimit:    http.StatusTooManyRequests,
	control.Canceled:         499, // the client went away; nobody reads this answer (as nginx does)
	control.Internal:         http.StatusInternalServerError,
	control.NotImplemented:   http.StatusNotImplemented,
	control.BadGateway:       http.StatusBadGateway,
	control.GuestError:       http.StatusBadGateway,
	control.Unavailable:      http.StatusServiceUnavailable,
	control.Timeout:          http.StatusGatewayTimeout,
	control.NoSpace:          http.StatusInsufficientStorage,
}

// statusOf is kind k's HTTP status (500 for a kind without one).
func statusOf(k control.Kind) int {
	if st, ok := statuses[k]; ok {
		return st
	}
	return http.StatusInternalServerError
}

func errorf(k control.Kind, format string, args ...any) *control.Error {
	return control.Errorf(k, format, args...)
}

func badRequest(format string, args ...any) *control.Error {
	return control.Errorf(control.BadRequest, format, args...)
}

func invalid(format string, args ...any) *control.Error {
	return control.Errorf(control.Invalid, format, args...)
}

func notFound(format string, args ...any) *control.Error {
	return control.Errorf(control.NotFound, format, args...)
}

func conflict(format string, args ...any) *control.Error {
	return control.Errorf(control.Conflict, format, args...)
}

// answer is what users see of an error.
type answer struct {
	Status  int
	Code    string
	Message string
}

// classify turns any error into the answer users see: control.Classify's
// kind and message, and the kind's status. A request body over its limit
// (http.MaxBytesError) is classified here, being HTTP's.
func classify(err error) answer {
	var ce *control.Error
	var mbe *http.MaxBytesError
	if !errors.As(err, &ce) && errors.As(err, &mbe) {
		ce = control.Errorf(control.TooLarge, "request body is larger than %d bytes", mbe.Limit)
	} else {
		ce = control.Classify(err)
	}
	return answer{Status: statusOf(ce.Kind), Code: string(ce.Kind), Message: ce.Msg}
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError sends err as the JSON error body. Internal errors are logged
// here, where they are handled, with the request's details.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := s.logFailure(r, err)
	writeJSON(w, ae.Status, errorBody{Error: errorDetail{Code: ae.Code, Message: ae.Message}})
}

// logFailure logs a request's failure at the level its status calls for
// and returns its classification.
func (s *Server) logFailure(r *http.Request, err error) answer {
	ae := classify(err)
	if ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusInsufficientStorage && ae.Status != http.StatusBadGateway {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	} else if ae.Status >= 500 {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	} else {
		s.log.Debug("request rejected", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	}
	return ae
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if err := enc.Encode(v); err != nil {
		slog.Debug("write response", "err", err)
	}
}
