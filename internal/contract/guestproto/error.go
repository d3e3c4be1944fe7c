package guestproto

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// Code classifies an error reported by the guest.
type Code string

// Error codes. Each is of a class (Code.Class).
const (
	CodeNotFound   Code = "not_found"  // no such file, directory or executable (404)
	CodeExists     Code = "exists"     // the path already exists as something else (409)
	CodeNotDir     Code = "not_dir"    // a path component is not a directory (422)
	CodeIsDir      Code = "is_dir"     // a file operation named a directory (422)
	CodeNotEmpty   Code = "not_empty"  // non-recursive remove of a non-empty directory (409)
	CodePermission Code = "permission" // EACCES/EPERM (403)
	CodeInvalid    Code = "invalid"    // malformed request: relative path, NUL byte... (422)
	CodeTimeout    Code = "timeout"    // the operation timed out
	CodeCanceled   Code = "canceled"   // the peer aborted the stream (RESET sent on cancel)
	CodeTooLarge   Code = "too_large"  // the guest's answer exceeds a host limit, e.g. a listing of too many entries (422)
	CodeBusy       Code = "busy"       // the host's limit of concurrent operations on this guest is reached; retry later (429)
	CodeExited     Code = "exited"     // the background process has exited or its stdin is closed (409)
	CodeRefused    Code = "refused"    // a dial: nothing listens on the guest's port (connection refused; 502)
	CodeInternal   Code = "internal"   // anything else
)

// Class is the error class (internal/contract/errs) of an error of code
// c, as users see it: a guest's failure of its own (CodeInternal) is
// errs.GuestError; a code this host does not know is errs.Internal.
func (c Code) Class() errs.Class {
	switch c {
	case CodeNotFound:
		return errs.NotFound
	case CodeExists, CodeNotEmpty, CodeExited:
		return errs.Conflict
	case CodeNotDir, CodeIsDir, CodeInvalid, CodeTooLarge:
		return errs.Invalid
	case CodePermission:
		return errs.Forbidden
	case CodeTimeout:
		return errs.Timeout
	case CodeCanceled:
		return errs.Canceled
	case CodeBusy:
		return errs.TooManyRequests
	case CodeRefused:
		return errs.BadGateway
	case CodeInternal:
		return errs.GuestError
	}
	return errs.Internal
}

// Error is an error the guest reported (a Reply error or a RESET payload),
// or one the host's Client raised on the guest's behalf when the guest broke
// a limit (CodeTooLarge, CodeTimeout) or the host's own limit was reached
// (CodeBusy). Its Code crosses process boundaries; its Message is written
// for users.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message,omitempty"`
}

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "guest: " + string(e.Code)
	}
	return "guest: " + string(e.Code) + ": " + e.Message
}

// Is makes errors.Is match the sentinel of e's code (ErrNotFound...), the
// fs sentinels fs.ErrNotExist, fs.ErrExist and fs.ErrPermission,
// context.DeadlineExceeded (CodeTimeout) and syscall.ECONNREFUSED
// (CodeRefused), as a net.Dialer's refused connection does.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *Error:
		return t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
	}
	switch target {
	case fs.ErrNotExist:
		return e.Code == CodeNotFound
	case fs.ErrExist:
		return e.Code == CodeExists
	case fs.ErrPermission:
		return e.Code == CodePermission
	case context.DeadlineExceeded:
		return e.Code == CodeTimeout
	case syscall.ECONNREFUSED:
		return e.Code == CodeRefused
	}
	return false
}

// ErrnoCode is the code of a file operation's errno (CodeInternal for one
// with no code of its own).
func ErrnoCode(errno syscall.Errno) Code {
	switch errno {
	case syscall.ENOENT:
		return CodeNotFound
	case syscall.EEXIST:
		return CodeExists
	case syscall.ENOTDIR:
		return CodeNotDir
	case syscall.EISDIR:
		return CodeIsDir
	case syscall.ENOTEMPTY:
		return CodeNotEmpty
	case syscall.EACCES, syscall.EPERM, syscall.EROFS:
		return CodePermission
	case syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EXDEV:
		return CodeInvalid
	case syscall.ETIMEDOUT:
		return CodeTimeout
	}
	return CodeInternal
}

// Sentinels for errors.Is; they match any *Error of the same code.
var (
	ErrNotFound   = &Error{Code: CodeNotFound}
	ErrExists     = &Error{Code: CodeExists}
	ErrNotDir     = &Error{Code: CodeNotDir}
	ErrIsDir      = &Error{Code: CodeIsDir}
	ErrNotEmpty   = &Error{Code: CodeNotEmpty}
	ErrPermission = &Error{Code: CodePermission}
	ErrInvalid    = &Error{Code: CodeInvalid}
	ErrTimeout    = &Error{Code: CodeTimeout}
	ErrCanceled   = &Error{Code: CodeCanceled}
	ErrTooLarge   = &Error{Code: CodeTooLarge}
	ErrBusy       = &Error{Code: CodeBusy}
	ErrExited     = &Error{Code: CodeExited}
	ErrRefused    = &Error{Code: CodeRefused}
	ErrInternal   = &Error{Code: CodeInternal}
)

// CodeOf returns the code of the *Error in err's chain, or "" if there is none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// Connection-level errors. They are not *Error: nothing was reported by the guest.
var (
	// ErrClosed is returned after Close or after the connection failed;
	// the reason it failed is wrapped too (ErrUnresponsive,
	// ErrInvalidFrame, a read error).
	ErrClosed = errors.New("guest connection closed")
	// ErrUnresponsive is why a Client's connection failed when a write to
	// the guest made no progress for ClientConfig.WriteTimeout: the guest
	// stopped reading its channel. Errors wrapping it wrap ErrClosed too.
	ErrUnresponsive = errors.New("guest agent stopped reading its channel")
	// ErrSilent is why a Client's connection failed when a call waited
	// ClientConfig.ProbeAfter for its answer and the guest then answered
	// no PING within ClientConfig.ProbeTimeout: nothing on the connection
	// works any more, and a new connection (a new session) is the only
	// way on. Errors wrapping it wrap ErrClosed too.
	ErrSilent = errors.New("guest agent answers nothing")
	// ErrTooManyStreams matches the error returned at once, without asking
	// the guest, when a Client already has ClientConfig.MaxStreams
	// operations (execs, file transfers, file operations) in flight: a
	// *Error of CodeBusy (it is ErrBusy). The caller may retry later.
	ErrTooManyStreams = ErrBusy
	// ErrNoSession is returned by stream operations before Hello succeeded.
	ErrNoSession = errors.New("no guest session: call Hello first")
	// ErrSessionReset is returned on the guest side for streams of a session
	// that a new HELLO (or a disconnect) replaced.
	ErrSessionReset = errors.New("guest session reset")
	// ErrStreamDone is returned when writing to a stream the guest finished.
	ErrStreamDone = errors.New("stream finished")
)
