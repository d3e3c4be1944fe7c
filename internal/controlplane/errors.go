package controlplane

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Kind is the class of an error as users see it. Its value is the `code`
// of the REST API's error body ({"error": {"code": ..., "message": ...}}):
// api/openapi.yaml and the SDKs depend on these strings, so they never
// change. What HTTP status a kind is answered with is decided in one place,
// internal/controlplane/rest (E2B's API uses the same mapping).
type Kind string

// The kinds. Request-level ones (BadRequest, Unauthorized, TooLarge,
// MethodNotAllowed) are raised by the HTTP layer itself; the others by the
// control plane or by Classify.
const (
	BadRequest       Kind = "bad_request"          // malformed request (JSON, a network policy entry)
	Unauthorized     Kind = "unauthorized"         // no or an unknown API key
	Forbidden        Kind = "forbidden"            // the key, a signed URL or the guest refused
	NotFound         Kind = "not_found"            // unknown sandbox, snapshot, template, file, key
	MethodNotAllowed Kind = "method_not_allowed"   // no such method on a route
	Conflict         Kind = "conflict"             // wrong state, name or id in use
	Corrupt          Kind = "corrupt"              // a capture or snapshot fails its checksums
	TooLarge         Kind = "payload_too_large"    // a request body over its limit
	Invalid          Kind = "invalid"              // well-formed but bad values
	QuotaExceeded    Kind = "quota_exceeded"       // over the key's sandbox, memory, vCPU or disk quota
	TooManyRequests  Kind = "too_many_requests"    // too many requests in flight
	TemplateLimit    Kind = "template_limit"       // too many templates or builds
	Canceled         Kind = "canceled"             // the client went away
	Internal         Kind = "internal"             // a bug or an unexpected failure
	NotImplemented   Kind = "not_implemented"      // not supported by this server
	BadGateway       Kind = "bad_gateway"          // a server in a sandbox failed the port proxy
	GuestError       Kind = "guest_error"          // the guest agent failed or broke its protocol
	Unavailable      Kind = "unavailable"          // a host, guest or the server cannot serve now; retry
	Timeout          Kind = "timeout"              // an operation ran out of time
	NoSpace          Kind = "insufficient_storage" // a host's store or a guest's disk is full
)

// ServerSide reports whether an error of kind k is a failure of the
// server, a host or a guest rather than of the request: those are logged
// where they are handled.
func (k Kind) ServerSide() bool {
	switch k {
	case Internal, NotImplemented, BadGateway, GuestError, Unavailable, Timeout, NoSpace:
		return true
	}
	return false
}

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

// Errorf returns an error of kind k with a message for users.
func Errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Classify returns what users see of err: the *Error in its chain, or the
// kind and message of the internal error class it belongs to (host,
// catalog, template, template build, network policy, guest, context), or
// Internal ("internal error"). It is the one place where internal error
// classes become kinds; the result wraps err.
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
	var re *templates.ReadyError
	switch {
	case errors.As(err, &re):
		// The template's own commands failed in its bake: what the user
		// gave is what does not work, and its output says why.
		return Errorf(Invalid, "the template's bake failed: %s", re.Msg)
	case errors.Is(err, netpolicy.ErrInvalid):
		// The message names the entry: a bad request, as a malformed body.
		var pe *netpolicy.Error
		if errors.As(err, &pe) {
			return Errorf(BadRequest, "%s", pe.Error())
		}
		return Errorf(BadRequest, "%s", userMessage(err))
	case errors.Is(err, host.ErrNoSpace):
		// The underlying error names host paths: users get the class.
		return Errorf(NoSpace, "the host is out of disk space for sandboxes; kill sandboxes or delete snapshots")
	case errors.Is(err, host.ErrCorrupt):
		return Errorf(Corrupt, "%s", userMessage(err))
	case errors.Is(err, host.ErrExhausted):
		return Errorf(Unavailable, "the host has no room for more sandboxes right now; retry later")
	case errors.Is(err, host.ErrNotReady):
		return Errorf(Unavailable, "the sandbox's guest agent has not answered since the server restarted; retry in a few seconds")
	case errors.Is(err, catalog.ErrQuota):
		msg := userMessage(err)
		var qe *catalog.QuotaError
		if errors.As(err, &qe) {
			msg = qe.Error() // says which limit and the numbers, without our wrapping
		}
		return Errorf(QuotaExceeded, "%s", msg)
	case errors.Is(err, builds.ErrUnsupported):
		return Errorf(NotImplemented, "this server does not build templates from Dockerfiles yet; build and push an image, and build the template with from_image")
	case errors.Is(err, builds.ErrLimit):
		return Errorf(TemplateLimit, "%s", userMessage(err))
	case errors.Is(err, builds.ErrBusy):
		return Errorf(TooManyRequests, "%s", userMessage(err))
	case errors.Is(err, builds.ErrNoSpace):
		// Its text is written for users (tmplbuild.Config.CheckSpace).
		return Errorf(NoSpace, "%s", userMessage(err))
	case errors.Is(err, builds.ErrClosed):
		return Errorf(Unavailable, "%s", userMessage(err))
	case errors.Is(err, host.ErrNotFound), errors.Is(err, templates.ErrNotFound), errors.Is(err, catalog.ErrNotFound), errors.Is(err, builds.ErrNotFound):
		return Errorf(NotFound, "%s", userMessage(err))
	case errors.Is(err, host.ErrInvalid), errors.Is(err, templates.ErrInvalid):
		return Errorf(Invalid, "%s", userMessage(err))
	case errors.Is(err, host.ErrConflict), errors.Is(err, catalog.ErrConflict), errors.Is(err, builds.ErrConflict), errors.Is(err, templates.ErrConflict):
		return Errorf(Conflict, "%s", userMessage(err))
	case errors.As(err, new(*host.UnreachableError)):
		// Its text names the agent's address: for the logs only.
		return Errorf(Unavailable, "a host agent cannot be reached right now; retry in a few seconds")
	case errors.Is(err, host.ErrUnavailable):
		return Errorf(Unavailable, "%s", userMessage(err))
	case errors.Is(err, errors.ErrUnsupported):
		return Errorf(NotImplemented, "%s", userMessage(err))
	}
	// A guest's own classes first: a guest timeout says more than the
	// context error it also matches.
	switch guestproto.CodeOf(err) {
	case guestproto.CodeNotFound:
		return Errorf(NotFound, "%s", GuestMessage(err))
	case guestproto.CodeExists, guestproto.CodeNotEmpty, guestproto.CodeExited:
		return Errorf(Conflict, "%s", GuestMessage(err))
	case guestproto.CodeNotDir, guestproto.CodeIsDir, guestproto.CodeInvalid, guestproto.CodeTooLarge:
		return Errorf(Invalid, "%s", GuestMessage(err))
	case guestproto.CodePermission:
		return Errorf(Forbidden, "%s", GuestMessage(err))
	case guestproto.CodeTimeout:
		return Errorf(Timeout, "%s", GuestMessage(err))
	case guestproto.CodeBusy:
		return Errorf(TooManyRequests, "the sandbox has too many operations in flight (exec, files); wait for some to finish")
	case guestproto.CodeInternal:
		if isNoSpace(err) {
			return Errorf(NoSpace, "the sandbox is out of disk space")
		}
		// The guest agent failed, or broke the protocol (a guest is
		// untrusted): not the server's fault. Its text is capped.
		msg := GuestMessage(err)
		if len(msg) > 512 {
			msg = strings.ToValidUTF8(msg[:512], "") + "…"
		}
		return Errorf(GuestError, "the sandbox's guest agent failed: %s", msg)
	}
	switch {
	case errors.Is(err, context.Canceled):
		return Errorf(Canceled, "the request was canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return Errorf(Timeout, "the operation timed out")
	case errors.Is(err, guestproto.ErrUnresponsive), errors.Is(err, guestproto.ErrInvalidFrame), errors.Is(err, guestproto.ErrClosed):
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
