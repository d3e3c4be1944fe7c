package controlplane

import (
	"errors"
	"fmt"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/errs"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Kind is the class of an error as users see it: the contract's class
// (internal/contract/errs), whose value is the `code` of the REST API's
// error body ({"error": {"code": ..., "message": ...}}). What HTTP status
// a kind is answered with is decided in one place,
// internal/controlplane/rest (E2B's API uses the same mapping).
type Kind = errs.Class

// The kinds, the contract's classes under the names the control plane
// has always used.
const (
	BadRequest       = errs.BadRequest
	Unauthorized     = errs.Unauthorized
	Forbidden        = errs.Forbidden
	NotFound         = errs.NotFound
	MethodNotAllowed = errs.MethodNotAllowed
	Conflict         = errs.Conflict
	Corrupt          = errs.Corrupt
	TooLarge         = errs.TooLarge
	Invalid          = errs.Invalid
	QuotaExceeded    = errs.QuotaExceeded
	TooManyRequests  = errs.TooManyRequests
	TemplateLimit    = errs.TemplateLimit
	Canceled         = errs.Canceled
	Internal         = errs.Internal
	NotImplemented   = errs.NotImplemented
	BadGateway       = errs.BadGateway
	GuestError       = errs.GuestError
	Unavailable      = errs.Unavailable
	Timeout          = errs.Timeout
	NoSpace          = errs.NoSpace
)

// Error is an error as users see it: its kind, a message written for users,
// and the internal error that caused it (logged by whoever handles the
// error, never shown: it may name host paths).
type Error struct {
	Kind Kind
	Msg  string
	Err  error // nil: none
}

func (e *Error) Error() string {
	if e.Err != nil {
		return string(e.Kind) + ": " + e.Msg + ": " + e.Err.Error()
	}
	return string(e.Kind) + ": " + e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes an *Error of its kind (errors.Is(err, errs.NotFound)).
func (e *Error) Is(target error) bool { return target == error(e.Kind) }

// Errorf returns an error of kind k with a message for users.
func Errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Classify returns what users see of err: the *Error in its chain, or
// its class (errs.ClassOf) with a message for users, or Internal
// ("internal error"). It is the one place where errors become kinds; the
// result wraps err.
func Classify(err error) *Error {
	var ce *Error
	if errors.As(err, &ce) {
		return ce
	}
	e := classify(err)
	e.Err = err
	return e
}

func classify(err error) *Error {
	// The errors whose text is not for users (it names host paths or
	// addresses, or the wrapping says less than the error itself): a
	// message of their own.
	var re *templates.ReadyError
	var pe *netpolicy.Error
	var qe *catalog.QuotaError
	switch {
	case errors.As(err, &re):
		// The template's own commands failed in its bake: what the user
		// gave is what does not work, and its output says why.
		return Errorf(Invalid, "the template's bake failed: %s", re.Msg)
	case errors.As(err, &pe):
		// The message names the entry: a bad request, as a malformed body.
		return Errorf(BadRequest, "%s", pe.Error())
	case errors.Is(err, host.ErrNoSpace):
		return Errorf(NoSpace, "the host is out of disk space for sandboxes; kill sandboxes or delete snapshots")
	case errors.Is(err, host.ErrExhausted):
		return Errorf(Unavailable, "the host has no room for more sandboxes right now; retry later")
	case errors.Is(err, host.ErrNotReady):
		return Errorf(Unavailable, "the sandbox's guest agent has not answered since the server restarted; retry in a few seconds")
	case errors.As(err, &qe):
		// It says which limit and the numbers, without our wrapping.
		return Errorf(QuotaExceeded, "%s", qe.Error())
	case errors.Is(err, builds.ErrUnsupported):
		return Errorf(NotImplemented, "this server does not build templates from Dockerfiles yet; build and push an image, and build the template with from_image")
	case errors.As(err, new(*host.UnreachableError)):
		// Its text names the agent's address: for the logs only.
		return Errorf(Unavailable, "a host agent cannot be reached right now; retry in a few seconds")
	case errors.Is(err, hostwire.ErrUnauthorized):
		// A host agent rejected this server's token: the server's fault
		// (its configuration), not the user's key.
		return Errorf(Internal, "internal error")
	}
	if k, ok := errs.Of(err); ok {
		// Internal errors are wrapped with short phrases that read well
		// to users ("create sandbox: out of disk space: ...").
		return Errorf(k, "%s", userMessage(err))
	}
	// A guest's own classes next (guestproto.Code.Class), with the guest's
	// own message: a guest timeout says more than the context error it also
	// matches. A stream the guest reset (CodeCanceled) is nothing the user
	// did, and a code this host does not know says nothing: both are
	// internal.
	code := guestproto.CodeOf(err)
	if k := code.Class(); k != Internal && k != Canceled {
		switch {
		case code == guestproto.CodeBusy:
			return Errorf(k, "the sandbox has too many operations in flight (exec, files); wait for some to finish")
		case k == GuestError && isNoSpace(err):
			return Errorf(NoSpace, "the sandbox is out of disk space")
		case k == GuestError:
			// The guest agent failed, or broke the protocol (a guest is
			// untrusted): not the server's fault. Its text is capped.
			msg := GuestMessage(err)
			if len(msg) > 512 {
				msg = strings.ToValidUTF8(msg[:512], "") + "…"
			}
			return Errorf(GuestError, "the sandbox's guest agent failed: %s", msg)
		default:
			return Errorf(k, "%s", GuestMessage(err))
		}
	}
	switch errs.ClassOf(err) {
	case Canceled:
		return Errorf(Canceled, "the request was canceled")
	case Timeout:
		return Errorf(Timeout, "the operation timed out")
	case NotImplemented:
		return Errorf(NotImplemented, "%s", userMessage(err))
	}
	if errors.Is(err, guestproto.ErrUnresponsive) || errors.Is(err, guestproto.ErrInvalidFrame) || errors.Is(err, guestproto.ErrClosed) {
		// The guest agent broke its channel (stopped reading, sent garbage)
		// or the sandbox stopped meanwhile: the host reconnects to it.
		return Errorf(Unavailable, "the sandbox's guest agent stopped answering; retry, or kill the sandbox")
	}
	if isNoSpace(err) {
		return Errorf(NoSpace, "the sandbox is out of disk space")
	}
	return Errorf(Internal, "internal error")
}

// userMessage is err's text; internal errors are wrapped with short
// phrases that read well to users ("create sandbox: out of disk space: ...").
func userMessage(err error) string { return err.Error() }

// GuestMessage is the guest's own message in err (a *guestproto.Error), else
// err's text: it prefers the guest's own message over the wrapping.
func GuestMessage(err error) string {
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
