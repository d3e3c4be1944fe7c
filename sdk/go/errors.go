package pandastack

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Sentinels for errors.Is, one per error code of the API. An *Error matches
// the sentinel of its code.
var (
	ErrBadRequest          = errors.New("bad request")
	ErrUnauthorized        = errors.New("unauthorized")
	ErrForbidden           = errors.New("forbidden")
	ErrNotFound            = errors.New("not found")
	ErrConflict            = errors.New("conflict")
	ErrPayloadTooLarge     = errors.New("payload too large")
	ErrInvalid             = errors.New("invalid")
	ErrQuotaExceeded       = errors.New("quota exceeded")
	ErrInternal            = errors.New("internal server error")
	ErrUnavailable         = errors.New("unavailable")
	ErrInsufficientStorage = errors.New("insufficient storage")
)

// Error codes of the API, as found in Error.Code.
const (
	CodeBadRequest      = "bad_request"
	CodeUnauthorized    = "unauthorized"
	CodeForbidden       = "forbidden"
	CodeNotFound        = "not_found"
	CodeConflict        = "conflict"
	CodePayloadTooLarge = "payload_too_large"
	CodeInvalid         = "invalid"
	CodeQuotaExceeded   = "quota_exceeded"
	// CodeTemplateLimit: the key owns its limit of templates (a 429,
	// matching ErrQuotaExceeded too).
	CodeTemplateLimit       = "template_limit"
	CodeInternal            = "internal"
	CodeUnavailable         = "unavailable"
	CodeInsufficientStorage = "insufficient_storage"
)

var codes = []struct {
	code     string
	status   int
	sentinel error
}{
	{CodeBadRequest, http.StatusBadRequest, ErrBadRequest},
	{CodeUnauthorized, http.StatusUnauthorized, ErrUnauthorized},
	{CodeForbidden, http.StatusForbidden, ErrForbidden},
	{CodeNotFound, http.StatusNotFound, ErrNotFound},
	{CodeConflict, http.StatusConflict, ErrConflict},
	{CodePayloadTooLarge, http.StatusRequestEntityTooLarge, ErrPayloadTooLarge},
	{CodeInvalid, http.StatusUnprocessableEntity, ErrInvalid},
	{CodeQuotaExceeded, http.StatusTooManyRequests, ErrQuotaExceeded},
	{CodeInternal, http.StatusInternalServerError, ErrInternal},
	{CodeUnavailable, http.StatusServiceUnavailable, ErrUnavailable},
	{CodeInsufficientStorage, http.StatusInsufficientStorage, ErrInsufficientStorage},
}

// Error is an error answered by the server: an HTTP status with the body
// {"error": {"code": ..., "message": ...}}. Errors carried inside a stream
// (exec, bake, fork children) have the Status their code has over HTTP.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ToLower(http.StatusText(e.Status))
	}
	if msg == "" {
		msg = "error"
	}
	if e.Code == "" {
		return msg
	}
	return msg + " (" + e.Code + ")"
}

// Is reports whether target is the sentinel of e's code.
func (e *Error) Is(target error) bool {
	if e.Code == CodeTemplateLimit && target == ErrQuotaExceeded {
		return true
	}
	for _, c := range codes {
		if c.sentinel == target {
			return e.Code == c.code
		}
	}
	return false
}

// codeStatus is the HTTP status of each error code of the API (the table
// of api/openapi.yaml; wire_test.go holds it to it), for the errors that
// come without one: inside a stream, a fork's children.
var codeStatus = map[string]int{
	CodeBadRequest: http.StatusBadRequest, CodeUnauthorized: http.StatusUnauthorized,
	CodeForbidden: http.StatusForbidden, CodeNotFound: http.StatusNotFound,
	"method_not_allowed": http.StatusMethodNotAllowed, CodeConflict: http.StatusConflict,
	"corrupt": http.StatusConflict, CodePayloadTooLarge: http.StatusRequestEntityTooLarge,
	CodeInvalid: http.StatusUnprocessableEntity, CodeQuotaExceeded: http.StatusTooManyRequests,
	"too_many_requests": http.StatusTooManyRequests, CodeTemplateLimit: http.StatusTooManyRequests,
	CodeInternal: http.StatusInternalServerError, "not_implemented": http.StatusNotImplemented,
	"guest_error": http.StatusBadGateway, "bad_gateway": http.StatusBadGateway,
	CodeUnavailable: http.StatusServiceUnavailable, "timeout": http.StatusGatewayTimeout,
	CodeInsufficientStorage: http.StatusInsufficientStorage,
}

// newError fills in whichever of status and code is missing.
func newError(status int, code, message string) *Error {
	for _, c := range codes {
		if code == "" && status == c.status {
			code = c.code
		}
		if status == 0 && code == c.code {
			status = c.status
		}
	}
	if status == 0 {
		status = codeStatus[code]
	}
	if code == "" {
		switch {
		case status >= 500:
			code = CodeInternal
		case status >= 400:
			code = CodeBadRequest
		}
	}
	return &Error{Status: status, Code: code, Message: message}
}

// errorFromResponse reads a non-2xx answer. Bodies that are not the API's
// error object (a proxy's HTML page, say) still give a useful error.
func errorFromResponse(resp *http.Response) *Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var body struct {
		Error *Error `json:"error"`
	}
	if json.Unmarshal(b, &body) == nil && body.Error != nil && (body.Error.Code != "" || body.Error.Message != "") {
		return newError(resp.StatusCode, body.Error.Code, body.Error.Message)
	}
	msg := strings.TrimSpace(string(b))
	if len(msg) > 200 || strings.ContainsAny(msg, "<\n") {
		msg = ""
	}
	if msg == "" {
		msg = fmt.Sprintf("%s %s: %s", resp.Request.Method, resp.Request.URL.Path, resp.Status)
	}
	return newError(resp.StatusCode, "", msg)
}

// unreachableError is a failure to connect to the server.
type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot connect to the PandaStack API: is `panda up` running at %s? (%v)", e.url, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// Is makes a failure to connect match ErrUnavailable.
func (e *unreachableError) Is(target error) bool { return target == ErrUnavailable }

// ForkError reports the children of a fork that could not be made. The
// children that were made are returned alongside it.
type ForkError struct {
	Requested int      // children asked for
	Failures  []*Error // one per child that failed
}

func (e *ForkError) Error() string {
	if len(e.Failures) == 0 {
		return fmt.Sprintf("fork: 0 of %d children failed", e.Requested)
	}
	return fmt.Sprintf("fork: %d of %d children failed: %v", len(e.Failures), e.Requested, e.Failures[0])
}

// Unwrap lets errors.Is see the failures (errors.Is(err, ErrQuotaExceeded)).
func (e *ForkError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f
	}
	return errs
}
