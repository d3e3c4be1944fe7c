package hostwire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Error classes, in the order the API classifies them (internal/controlplane/rest
// classify), so that an error matching several is sent as the class that
// decides its HTTP status. A code is never renamed: an agent and a server
// of adjacent versions must read each other's.
var classes = []struct {
	code   string
	status int
	class  error
}{
	{"no_space", http.StatusInsufficientStorage, host.ErrNoSpace},
	{"builds_unsupported", http.StatusNotImplemented, builds.ErrUnsupported},
	{"template_limit", http.StatusTooManyRequests, builds.ErrLimit},
	{"builds_busy", http.StatusTooManyRequests, builds.ErrBusy},
	{"builds_no_space", http.StatusInsufficientStorage, builds.ErrNoSpace},
	{"builds_closed", http.StatusServiceUnavailable, builds.ErrClosed},
	{"build_not_found", http.StatusNotFound, builds.ErrNotFound},
	{"corrupt", http.StatusConflict, host.ErrCorrupt},
	{"not_ready", http.StatusServiceUnavailable, host.ErrNotReady},
	{"not_found", http.StatusNotFound, host.ErrNotFound},
	{"template_not_found", http.StatusNotFound, templates.ErrNotFound},
	{"invalid", http.StatusUnprocessableEntity, host.ErrInvalid},
	{"template_invalid", http.StatusUnprocessableEntity, templates.ErrInvalid},
	{"conflict", http.StatusConflict, host.ErrConflict},
	{"build_conflict", http.StatusConflict, builds.ErrConflict},
	{"template_conflict", http.StatusConflict, templates.ErrConflict},
	{"unavailable", http.StatusServiceUnavailable, host.ErrUnavailable},
	{"unsupported", http.StatusNotImplemented, errors.ErrUnsupported},
	{"refused", http.StatusBadGateway, syscall.ECONNREFUSED}, // nothing listens on a guest's port
	{"timeout", http.StatusGatewayTimeout, context.DeadlineExceeded},
	{"canceled", http.StatusServiceUnavailable, context.Canceled},
	{"unauthorized", http.StatusUnauthorized, ErrUnauthorized},
}

// guestCodePrefix marks the code of a *guestproto.Error ("guest.not_found").
const guestCodePrefix = "guest."

// ErrorBody is the body of an error answer.
type ErrorBody struct {
	Error Error `json:"error"`
}

// Error is an error on the wire: its class's code and its text. It is
// also the payload of an error frame (FrameError), of an error line of a
// stream, and of the X-Panda-Error trailer.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// GuestMessage is the guest's own message of a guest error.
	GuestMessage string `json:"guest_message,omitempty"`
}

// EncodeError classifies err for the wire: the HTTP status of its answer
// and the Error sent. An error of no class is "internal" (500).
func EncodeError(err error) (int, Error) {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.status, Error{Code: c.code, Message: err.Error()}
		}
	}
	var ge *guestproto.Error
	if errors.As(err, &ge) {
		status := http.StatusUnprocessableEntity
		switch ge.Code {
		case guestproto.CodeNotFound:
			status = http.StatusNotFound
		case guestproto.CodeExists, guestproto.CodeNotEmpty:
			status = http.StatusConflict
		case guestproto.CodePermission:
			status = http.StatusForbidden
		case guestproto.CodeInternal, guestproto.CodeCanceled:
			status = http.StatusInternalServerError
		}
		return status, Error{Code: guestCodePrefix + string(ge.Code), Message: err.Error(), GuestMessage: ge.Message}
	}
	return http.StatusInternalServerError, Error{Code: "internal", Message: err.Error()}
}

// remoteError is an error the agent reported: its text, and the class it
// had there (nil for internal errors).
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// Err rebuilds the error the agent sent: with its text (the code if it
// had none) and, if the code names one, its class (errors.Is), or the
// guest's *guestproto.Error (errors.As).
func (e Error) Err() error {
	re := &remoteError{msg: e.Message}
	if re.msg == "" {
		re.msg = e.Code
	}
	for _, c := range classes {
		if c.code == e.Code {
			re.class = c.class
			return re
		}
	}
	if code, ok := strings.CutPrefix(e.Code, guestCodePrefix); ok && code != "" {
		re.class = &guestproto.Error{Code: guestproto.Code(code), Message: e.GuestMessage}
	}
	return re
}

// ReadError is the error of an answer res that is not 2xx: the agent's
// (ErrorBody), or, if the body is none (a proxy's answer, say),
// host.ErrUnavailable with the status and the body's start.
func ReadError(res *http.Response) error {
	var eb ErrorBody
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if json.Unmarshal(b, &eb) != nil || eb.Error.Code == "" {
		return fmt.Errorf("%w: host agent answered %s: %.200s", host.ErrUnavailable, res.Status, b)
	}
	return eb.Error.Err()
}

// TrailerError is the error res's X-Panda-Error trailer carries (read
// once the body is read to its end), or nil.
func TrailerError(res *http.Response) error {
	v := res.Trailer.Get(HeaderError)
	if v == "" {
		return nil
	}
	var e Error
	if json.Unmarshal([]byte(v), &e) != nil {
		return nil
	}
	return e.Err()
}
