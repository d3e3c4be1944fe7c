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
	"github.com/pandastack/pandastack/internal/contract/errs"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// The host RPC sends an error as a code (Error.Code):
//
//   - one of named's, for the errors the control plane tells apart from
//     others of their class (a missing sandbox from a missing template)
//     or rewrites (a full disk's text names host paths);
//   - "guest." and a guest's own code for a *guestproto.Error;
//   - "class." and its class (internal/contract/errs) for any other error
//     of a class ("class.too_many_requests");
//   - "internal" for an error of none.
//
// A code is never renamed: an agent and a server of adjacent versions
// must read each other's (a server that does not know a code reads the
// error as internal, as it did before the code was sent).

// named are the errors sent under a name of their own, the codes they
// have always had, in the order the control plane classifies them: an
// error matching several goes as the first. A name goes before the
// error's class, as it always has: the control plane reads the name (a
// create refused for its network policy is host.ErrInvalid to it, though
// the policy's error is errs.BadRequest). class is the class of an error
// of the standard library, which has none in errs.
var named = []struct {
	code  string
	err   error
	class errs.Class // "": errs.ClassOf(err)
}{
	{code: "no_space", err: host.ErrNoSpace},
	{code: "builds_unsupported", err: builds.ErrUnsupported},
	{code: "template_limit", err: builds.ErrLimit},
	{code: "builds_busy", err: builds.ErrBusy},
	{code: "builds_no_space", err: builds.ErrNoSpace},
	{code: "builds_closed", err: builds.ErrClosed},
	{code: "build_not_found", err: builds.ErrNotFound},
	{code: "corrupt", err: host.ErrCorrupt},
	{code: "not_ready", err: host.ErrNotReady},
	{code: "exhausted", err: host.ErrExhausted},
	{code: "not_found", err: host.ErrNotFound},
	{code: "template_not_found", err: templates.ErrNotFound},
	{code: "invalid", err: host.ErrInvalid},
	{code: "template_invalid", err: templates.ErrInvalid},
	{code: "conflict", err: host.ErrConflict},
	{code: "build_conflict", err: builds.ErrConflict},
	{code: "template_conflict", err: templates.ErrConflict},
	{code: "unavailable", err: host.ErrUnavailable},
	{code: "unsupported", err: errors.ErrUnsupported},
	{code: "refused", err: syscall.ECONNREFUSED, class: errs.BadGateway}, // nothing listens on a guest's port
	{code: "timeout", err: context.DeadlineExceeded},
	{code: "canceled", err: context.Canceled},
	{code: "unauthorized", err: ErrUnauthorized},
}

// statuses is the HTTP status of an error answer of each class on the
// host RPC (a class without one: 500). Only people read it (a proxy's
// log, curl): the server reads the body's code.
var statuses = map[errs.Class]int{
	errs.BadRequest:       http.StatusBadRequest,
	errs.Unauthorized:     http.StatusUnauthorized,
	errs.Forbidden:        http.StatusForbidden,
	errs.NotFound:         http.StatusNotFound,
	errs.MethodNotAllowed: http.StatusMethodNotAllowed,
	errs.Conflict:         http.StatusConflict,
	errs.Corrupt:          http.StatusConflict,
	errs.TooLarge:         http.StatusRequestEntityTooLarge,
	errs.Invalid:          http.StatusUnprocessableEntity,
	errs.QuotaExceeded:    http.StatusTooManyRequests,
	errs.TooManyRequests:  http.StatusTooManyRequests,
	errs.TemplateLimit:    http.StatusTooManyRequests,
	errs.Canceled:         http.StatusServiceUnavailable, // the server's request was canceled: the agent did not serve it
	errs.NotImplemented:   http.StatusNotImplemented,
	errs.BadGateway:       http.StatusBadGateway,
	errs.Unavailable:      http.StatusServiceUnavailable,
	errs.Timeout:          http.StatusGatewayTimeout,
	errs.NoSpace:          http.StatusInsufficientStorage,
}

func statusOf(c errs.Class) int {
	if st, ok := statuses[c]; ok {
		return st
	}
	return http.StatusInternalServerError
}

// classCodePrefix marks the code of an error sent as its class
// ("class.too_many_requests").
const classCodePrefix = "class."

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
	for _, n := range named {
		if errors.Is(err, n.err) {
			c := n.class
			if c == "" {
				c = errs.ClassOf(n.err)
			}
			return statusOf(c), Error{Code: n.code, Message: err.Error()}
		}
	}
	var ge *guestproto.Error
	if errors.As(err, &ge) {
		return statusOf(ge.Code.Class()), Error{Code: guestCodePrefix + string(ge.Code), Message: err.Error(), GuestMessage: ge.Message}
	}
	if c := errs.ClassOf(err); c != errs.Internal {
		return statusOf(c), Error{Code: classCodePrefix + string(c), Message: err.Error()}
	}
	return http.StatusInternalServerError, Error{Code: string(errs.Internal), Message: err.Error()}
}

// remoteError is an error the agent reported: its text, and what it was
// there (nil for internal errors): a named error, a class, or a guest's
// *guestproto.Error.
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// Err rebuilds the error the agent sent: with its text (the code if it
// had none) and what its code names: a named error or a class
// (errors.Is), or the guest's *guestproto.Error (errors.As).
func (e Error) Err() error {
	re := &remoteError{msg: e.Message}
	if re.msg == "" {
		re.msg = e.Code
	}
	for _, n := range named {
		if n.code == e.Code {
			re.class = n.err
			return re
		}
	}
	if c, ok := strings.CutPrefix(e.Code, classCodePrefix); ok && errs.Class(c).Known() {
		re.class = errs.Class(c)
	} else if code, ok := strings.CutPrefix(e.Code, guestCodePrefix); ok && code != "" {
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
