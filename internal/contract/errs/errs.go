// Package errs owns the error classes of PandaStack: the one set every
// package's errors belong to, whose values are the `code` strings of the
// REST API's error body ({"error": {"code": "not_found", ...}}).
//
// An error is of a class when errors.Is(err, class) holds. There are two
// ways to make one:
//
//   - wrap the class where the error is raised:
//     fmt.Errorf("template %q: %w", name, errs.NotFound);
//   - declare a sentinel that is an instance of its class,
//     ErrNotReady = errs.New(errs.Unavailable, "guest agent not answering yet"),
//     where callers must tell it apart from other errors of its class
//     (a host's missing sandbox from a missing template; a message that
//     the control plane rewrites because its text names host paths).
//
// Packages keep the sentinels they had, redefined as instances: call
// sites that wrap or test them do not change, and no package has a set of
// its own any more, since what an error is to users is read from its
// class alone (ClassOf). Which HTTP status a class is answered with is
// decided once by the REST API (internal/controlplane/rest) and once by
// the host RPC (internal/contract/hostwire); a class's value never
// changes, since api/openapi.yaml, the SDKs and agents of adjacent
// versions read it.
package errs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Class is an error class. Its value is the REST API's error code.
// A Class is an error itself, so that errors can wrap it (%w) and
// errors.Is can test for it.
type Class string

// The classes. Request-level ones (BadRequest, Unauthorized, TooLarge,
// MethodNotAllowed) are mostly raised by the HTTP layer itself.
const (
	BadRequest       Class = "bad_request"          // malformed request (JSON, a network policy entry)
	Unauthorized     Class = "unauthorized"         // no or an unknown API key (or agent token)
	Forbidden        Class = "forbidden"            // the key, a signed URL or the guest refused
	NotFound         Class = "not_found"            // unknown sandbox, snapshot, template, file, key
	MethodNotAllowed Class = "method_not_allowed"   // no such method on a route
	Conflict         Class = "conflict"             // wrong state, name or id in use
	Corrupt          Class = "corrupt"              // a capture or snapshot fails its checksums
	TooLarge         Class = "payload_too_large"    // a request body over its limit
	Invalid          Class = "invalid"              // well-formed but bad values
	QuotaExceeded    Class = "quota_exceeded"       // over the key's sandbox, memory, vCPU or disk quota
	TooManyRequests  Class = "too_many_requests"    // too many requests or operations in flight
	TemplateLimit    Class = "template_limit"       // too many templates or template versions
	Canceled         Class = "canceled"             // the client went away
	Internal         Class = "internal"             // a bug or an unexpected failure
	NotImplemented   Class = "not_implemented"      // not supported by this server or host
	BadGateway       Class = "bad_gateway"          // a server in a sandbox failed the port proxy
	GuestError       Class = "guest_error"          // the guest agent failed or broke its protocol
	Unavailable      Class = "unavailable"          // a host, guest or the server cannot serve now; retry
	Timeout          Class = "timeout"              // an operation ran out of time
	NoSpace          Class = "insufficient_storage" // a host's store or a guest's disk is full
)

// All is every class, in the order ClassOf tries them: an error of
// several classes is of the first. The order is the control plane's
// since the first release (a full disk says more than the missing file
// it caused; a missing sandbox more than the unavailable host it was
// looked for on).
var All = []Class{
	BadRequest, NoSpace, Corrupt, QuotaExceeded, TemplateLimit, TooManyRequests,
	NotFound, Invalid, Conflict, Unavailable, NotImplemented,
	Unauthorized, Forbidden, MethodNotAllowed, TooLarge, Canceled, Timeout,
	BadGateway, GuestError, Internal,
}

// Error is c's text: its code in words ("not found").
func (c Class) Error() string { return strings.ReplaceAll(string(c), "_", " ") }

// ServerSide reports whether an error of class c is a failure of the
// server, a host or a guest rather than of the request: those are logged
// where they are handled.
func (c Class) ServerSide() bool {
	switch c {
	case Internal, NotImplemented, BadGateway, GuestError, Unavailable, Timeout, NoSpace:
		return true
	}
	return false
}

// Known reports whether c is one of All.
func (c Class) Known() bool { return slices.Contains(All, c) }

// classed is an error of a class: errors.Is matches the error itself
// (a sentinel made with New), its class, and what its text wraps.
type classed struct {
	class Class
	err   error // the text, and the causes it wraps (%w)
}

func (e *classed) Error() string   { return e.err.Error() }
func (e *classed) Unwrap() []error { return []error{e.class, e.err} }

// New returns an error of class c with text msg, distinct from every
// other error (a sentinel: errors.Is(err, New(...)) holds only for errors
// wrapping it) and of class c (errors.Is(err, c)).
func New(c Class, msg string) error { return &classed{class: c, err: errors.New(msg)} }

// Errorf returns an error of class c with fmt.Errorf's text and wrapping
// (%w).
func Errorf(c Class, format string, args ...any) error {
	return &classed{class: c, err: fmt.Errorf(format, args...)}
}

// Of returns the class of err, the first of All that err is, and
// whether it has one.
func Of(err error) (Class, bool) {
	if err == nil {
		return "", false
	}
	for _, c := range All {
		if errors.Is(err, c) {
			return c, true
		}
	}
	return "", false
}

// ClassOf returns the class of err: Of's, else the standard library's
// (context.Canceled is Canceled, context.DeadlineExceeded Timeout,
// errors.ErrUnsupported NotImplemented), else Internal. It is "" for nil.
func ClassOf(err error) Class {
	if c, ok := Of(err); ok || err == nil {
		return c
	}
	switch {
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return Timeout
	case errors.Is(err, errors.ErrUnsupported):
		return NotImplemented
	}
	return Internal
}
