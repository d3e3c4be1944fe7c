package rest

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/pandastack/pandastack/internal/controlplane"
)

// The REST API answers errors as {"error": {"code": ..., "message": ...}}:
// the code is the error's control.Kind, the message its user message. The
// control plane and the handlers return *control.Error (or internal errors
// that control.Classify classifies); this file is the one place where a
// kind becomes an HTTP status.

// statuses is the HTTP status of each kind; E2B's API (e2b.go) answers
// with the same ones.
var statuses = map[controlplane.Kind]int{
	controlplane.BadRequest:       http.StatusBadRequest,
	controlplane.Unauthorized:     http.StatusUnauthorized,
	controlplane.Forbidden:        http.StatusForbidden,
	controlplane.NotFound:         http.StatusNotFound,
	controlplane.MethodNotAllowed: http.StatusMethodNotAllowed,
	controlplane.Conflict:         http.StatusConflict,
	controlplane.Corrupt:          http.StatusConflict,
	controlplane.TooLarge:         http.StatusRequestEntityTooLarge,
	controlplane.Invalid:          http.StatusUnprocessableEntity,
	controlplane.QuotaExceeded:    http.StatusTooManyRequests,
	controlplane.TooManyRequests:  http.StatusTooManyRequests,
	controlplane.TemplateLimit:    http.StatusTooManyRequests,
	controlplane.Canceled:         499, // the client went away; nobody reads this answer (as nginx does)
	controlplane.Internal:         http.StatusInternalServerError,
	controlplane.NotImplemented:   http.StatusNotImplemented,
	controlplane.BadGateway:       http.StatusBadGateway,
	controlplane.GuestError:       http.StatusBadGateway,
	controlplane.Unavailable:      http.StatusServiceUnavailable,
	controlplane.Timeout:          http.StatusGatewayTimeout,
	controlplane.NoSpace:          http.StatusInsufficientStorage,
}

// statusOf is kind k's HTTP status (500 for a kind without one).
func statusOf(k controlplane.Kind) int {
	if st, ok := statuses[k]; ok {
		return st
	}
	return http.StatusInternalServerError
}

func errorf(k controlplane.Kind, format string, args ...any) *controlplane.Error {
	return controlplane.Errorf(k, format, args...)
}

func badRequest(format string, args ...any) *controlplane.Error {
	return controlplane.Errorf(controlplane.BadRequest, format, args...)
}

func invalid(format string, args ...any) *controlplane.Error {
	return controlplane.Errorf(controlplane.Invalid, format, args...)
}

func notFound(format string, args ...any) *controlplane.Error {
	return controlplane.Errorf(controlplane.NotFound, format, args...)
}

func conflict(format string, args ...any) *controlplane.Error {
	return controlplane.Errorf(controlplane.Conflict, format, args...)
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
	var ce *controlplane.Error
	var mbe *http.MaxBytesError
	if !errors.As(err, &ce) && errors.As(err, &mbe) {
		ce = controlplane.Errorf(controlplane.TooLarge, "request body is larger than %d bytes", mbe.Limit)
	} else {
		ce = controlplane.Classify(err)
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
