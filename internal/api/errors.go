package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/guestproto"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/network"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
	"github.com/pandastack/pandastack/internal/vmm"
)

// apiError is an error with the HTTP status and code users see. Its
// message is written for users.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *apiError {
	return errorf(http.StatusBadRequest, "bad_request", format, args...)
}

func invalid(format string, args ...any) *apiError {
	return errorf(http.StatusUnprocessableEntity, "invalid", format, args...)
}

func notFound(format string, args ...any) *apiError {
	return errorf(http.StatusNotFound, "not_found", format, args...)
}

func conflict(format string, args ...any) *apiError {
	return errorf(http.StatusConflict, "conflict", format, args...)
}

// classify turns any error into the apiError users see. It is the only
// place where internal error classes become HTTP statuses.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var mbe *http.MaxBytesError
	var re *template.ReadyError
	switch {
	case errors.As(err, &re):
		// The template's own commands failed in its bake: what the user
		// gave is what does not work, and its output says why.
		return errorf(http.StatusUnprocessableEntity, "invalid", "the template's bake failed: %s", re.Msg)
	case errors.As(err, &mbe):
		return errorf(http.StatusRequestEntityTooLarge, "payload_too_large", "request body is larger than %d bytes", mbe.Limit)
	case errors.Is(err, network.ErrInvalidPolicy):
		// The message names the entry: a 400, as for a malformed body.
		var pe *network.PolicyError
		if errors.As(err, &pe) {
			return badRequest("%s", pe.Error())
		}
		return badRequest("%s", userMessage(err))
	case errors.Is(err, host.ErrNoSpace):
		// The underlying error names host paths: users get the class.
		return errorf(http.StatusInsufficientStorage, "insufficient_storage", "the host is out of disk space for sandboxes; kill sandboxes or delete snapshots")
	case errors.Is(err, host.ErrCorrupt):
		return errorf(http.StatusConflict, "corrupt", "%s", userMessage(err))
	case errors.Is(err, vmm.ErrExhausted):
		return errorf(http.StatusServiceUnavailable, "unavailable", "the host has no room for more sandboxes right now; retry later")
	case errors.Is(err, host.ErrNotReady):
		return errorf(http.StatusServiceUnavailable, "unavailable", "the sandbox's guest agent has not answered since the server restarted; retry in a few seconds")
	case errors.Is(err, catalog.ErrQuota):
		msg := userMessage(err)
		var qe *catalog.QuotaError
		if errors.As(err, &qe) {
			msg = qe.Error() // says which limit and the numbers, without our wrapping
		}
		return errorf(http.StatusTooManyRequests, "quota_exceeded", "%s", msg)
	case errors.Is(err, tmplbuild.ErrUnsupported):
		return errorf(http.StatusNotImplemented, "not_implemented", "this server does not build templates from Dockerfiles yet; build and push an image, and build the template with from_image")
	case errors.Is(err, tmplbuild.ErrLimit):
		return errorf(http.StatusTooManyRequests, "template_limit", "%s", userMessage(err))
	case errors.Is(err, tmplbuild.ErrClosed):
		return errorf(http.StatusServiceUnavailable, "unavailable", "%s", userMessage(err))
	case errors.Is(err, host.ErrNotFound), errors.Is(err, template.ErrNotFound), errors.Is(err, catalog.ErrNotFound), errors.Is(err, tmplbuild.ErrNotFound):
		return errorf(http.StatusNotFound, "not_found", "%s", userMessage(err))
	case errors.Is(err, host.ErrInvalid), errors.Is(err, template.ErrInvalid):
		return errorf(http.StatusUnprocessableEntity, "invalid", "%s", userMessage(err))
	case errors.Is(err, host.ErrConflict), errors.Is(err, catalog.ErrConflict), errors.Is(err, tmplbuild.ErrConflict), errors.Is(err, template.ErrConflict):
		return errorf(http.StatusConflict, "conflict", "%s", userMessage(err))
	case errors.Is(err, host.ErrUnavailable):
		return errorf(http.StatusServiceUnavailable, "unavailable", "%s", userMessage(err))
	case errors.Is(err, errors.ErrUnsupported):
		return errorf(http.StatusNotImplemented, "not_implemented", "%s", userMessage(err))
	}
	// A guest's own classes first: a guest timeout says more than the
	// context error it also matches.
	switch guestproto.CodeOf(err) {
	case guestproto.CodeNotFound:
		return errorf(http.StatusNotFound, "not_found", "%s", guestMessage(err))
	case guestproto.CodeExists, guestproto.CodeNotEmpty, guestproto.CodeExited:
		return errorf(http.StatusConflict, "conflict", "%s", guestMessage(err))
	case guestproto.CodeNotDir, guestproto.CodeIsDir, guestproto.CodeInvalid, guestproto.CodeTooLarge:
		return errorf(http.StatusUnprocessableEntity, "invalid", "%s", guestMessage(err))
	case guestproto.CodePermission:
		return errorf(http.StatusForbidden, "forbidden", "%s", guestMessage(err))
	case guestproto.CodeTimeout:
		return errorf(http.StatusGatewayTimeout, "timeout", "%s", guestMessage(err))
	case guestproto.CodeBusy:
		return errorf(http.StatusTooManyRequests, "too_many_requests", "the sandbox has too many operations in flight (exec, files); wait for some to finish")
	case guestproto.CodeInternal:
		if isNoSpace(err) {
			return errorf(http.StatusInsufficientStorage, "insufficient_storage", "the sandbox is out of disk space")
		}
		// The guest agent failed, or broke the protocol (a guest is
		// untrusted): not the server's fault. Its text is capped.
		msg := guestMessage(err)
		if len(msg) > 512 {
			msg = strings.ToValidUTF8(msg[:512], "") + "…"
		}
		return errorf(http.StatusBadGateway, "guest_error", "the sandbox's guest agent failed: %s", msg)
	}
	switch {
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this answer. 499 as nginx does.
		return errorf(499, "canceled", "the request was canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return errorf(http.StatusGatewayTimeout, "timeout", "the operation timed out")
	case errors.Is(err, guestproto.ErrUnresponsive), errors.Is(err, guestproto.ErrInvalidFrame), errors.Is(err, guestproto.ErrClosed):
		// The guest agent broke its channel (stopped reading, sent garbage)
		// or the sandbox stopped meanwhile: the host reconnects to it.
		return errorf(http.StatusServiceUnavailable, "unavailable", "the sandbox's guest agent stopped answering; retry, or kill the sandbox")
	}
	if isNoSpace(err) {
		return errorf(http.StatusInsufficientStorage, "insufficient_storage", "the sandbox is out of disk space")
	}
	return errorf(http.StatusInternalServerError, "internal", "internal error")
}

// userMessage is err's text; internal errors are wrapped with short
// phrases that read well to users ("create sandbox: out of disk space: ...").
func userMessage(err error) string { return err.Error() }

// guestMessage prefers the guest's own message over the wrapping.
func guestMessage(err error) string {
	var ge *guestproto.Error
	if errors.As(err, &ge) && ge.Message != "" {
		return ge.Message
	}
	return err.Error()
}

func isNoSpace(err error) bool {
	var ge *guestproto.Error
	return errors.As(err, &ge) && strings.Contains(strings.ToLower(ge.Message), "no space left")
}

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"-"` // the HTTP status of Code (fork children, for the E2B API)
}

// writeError sends err as the JSON error body. Internal errors are logged
// here, where they are handled, with the request's details.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := classify(err)
	if ae.Status >= 500 && ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusInsufficientStorage && ae.Status != http.StatusBadGateway {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	} else if ae.Status >= 500 {
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	} else {
		s.log.Debug("request rejected", "method", r.Method, "path", r.URL.Path, "status", ae.Status, "err", err)
	}
	writeJSON(w, ae.Status, errorBody{Error: errorDetail{Code: ae.Code, Message: ae.Message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if err := enc.Encode(v); err != nil {
		slog.Debug("write response", "err", err)
	}
}
