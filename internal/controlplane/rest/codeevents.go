package rest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// The code interpreter's stream, translated: the guest's code server
// answers POST /execute with E2B's lines (stdout, stderr, result, error,
// number_of_executions, end_of_execution), and the API streams its own
// events (stdout, stderr, result, error, end; the CodeEvent schema). The
// guest is hostile: every line is bounded (maxCodeLine), every field's
// JSON type is checked, and a line that is not what the protocol says
// ends the stream with a GuestError event. codeStream is that
// translation, without I/O.

// maxCodeLine bounds one line of the guest's stream (an image of a cell's
// result is one line).
const maxCodeLine = 64 << 20

// Names of the error events the server makes itself.
const (
	codeGuestError   = "GuestError"
	codeTimeoutError = "TimeoutError"
)

// guestTruncatedMarker is the stderr line the guest's code server sends
// when a cell's output goes over its own cap.
const guestTruncatedMarker = "[output truncated: the cell wrote more than 100 MiB]"

// codeEvent is one line of the API's stream (the CodeEvent schema); which
// fields an event has depends on its type.
type codeEvent struct {
	Type string `json:"type"`
	// stdout, stderr
	Text *string `json:"text,omitempty"`
	// result
	IsMainResult *bool                      `json:"is_main_result,omitempty"`
	Data         map[string]json.RawMessage `json:"data,omitempty"`
	Chart        json.RawMessage            `json:"chart,omitempty"`
	// error
	Name      *string `json:"name,omitempty"`
	Value     *string `json:"value,omitempty"`
	Traceback *string `json:"traceback,omitempty"`
	// end
	ExecutionCount *int    `json:"execution_count,omitempty"`
	ContextID      *string `json:"context_id,omitempty"`
	DurationMS     *int64  `json:"duration_ms,omitempty"`
	Truncated      *bool   `json:"truncated,omitempty"`
}

// errorEvent is an error event.
func errorEvent(name, value, traceback string) codeEvent {
	return codeEvent{Type: "error", Name: &name, Value: &value, Traceback: &traceback}
}

// guestStreamError is an error event for a guest whose stream broke its
// protocol or was cut: the stream's last event.
func guestStreamError(format string, args ...any) codeEvent {
	return errorEvent(codeGuestError, "the sandbox's code interpreter "+fmt.Sprintf(format, args...), "")
}

// resultKeys maps the keys of a guest's result line to the MIME types of
// the API's data, and says whether the value must be a JSON string.
var resultKeys = map[string]struct {
	mime   string
	string bool
}{
	"text":       {"text/plain", true},
	"html":       {"text/html", true},
	"markdown":   {"text/markdown", true},
	"svg":        {"image/svg+xml", true},
	"png":        {"image/png", true},
	"jpeg":       {"image/jpeg", true},
	"pdf":        {"application/pdf", true},
	"latex":      {"text/latex", true},
	"javascript": {"application/javascript", true},
	"json":       {"application/json", false},
	"data":       {"application/vnd.pandastack.data+json", false},
}

// base64Keys are the result keys whose strings are base64.
var base64Keys = map[string]bool{"png": true, "jpeg": true, "pdf": true}

// codeStream translates one cell's stream, line by line. Its zero value
// is not ready: set maxOutput.
type codeStream struct {
	// maxOutput bounds the bytes of stdout and stderr forwarded, together.
	maxOutput int
	// contextID is the context the request named ("" for a default one),
	// for end when the guest does not say.
	contextID string

	output    int  // stdout and stderr bytes forwarded
	truncated bool // some were dropped (or the guest said it dropped some)
	marked    bool // the truncation marker was sent
	count     int  // number_of_executions
	ended     bool // end_of_execution came
	started   bool // some line came
}

// line translates one line of the guest's stream (without its newline)
// into the events to send: none (an execution count, output past the cap),
// one, or two (the last output that fits and the truncation marker). An
// error means the line broke the protocol: send guestStreamError with it
// and stop reading. After end_of_execution (its event has Type "end") the
// caller stops reading.
func (c *codeStream) line(b []byte, durationMS int64) ([]codeEvent, error) {
	c.started = true
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil // blank lines between objects are harmless
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
		return nil, errors.New("sent a line that is not a JSON object")
	}
	var typ string
	if err := stringField(fields, "type", &typ); err != nil {
		return nil, err
	}
	switch typ {
	case "stdout", "stderr":
		var text string
		if err := stringField(fields, "text", &text); err != nil {
			return nil, err
		}
		return c.output1(typ, text), nil
	case "result":
		ev, err := resultEvent(fields)
		if err != nil {
			return nil, err
		}
		return []codeEvent{ev}, nil
	case "error":
		var name, value, tb string
		for _, f := range []struct {
			key string
			dst *string
		}{{"name", &name}, {"value", &value}, {"traceback", &tb}} {
			if err := stringField(fields, f.key, f.dst); err != nil {
				return nil, err
			}
		}
		if name == "" {
			name = "Error"
		}
		return []codeEvent{errorEvent(name, value, tb)}, nil
	case "number_of_executions":
		var n int
		if err := intField(fields, "execution_count", &n); err != nil {
			return nil, err
		}
		c.count = n
		return nil, nil
	case "end_of_execution":
		cid := c.contextID
		if err := stringField(fields, "context_id", &cid); err != nil {
			return nil, err
		}
		if cid != "" && !validContextID(cid) {
			return nil, errors.New("named its context with an invalid id")
		}
		var d int
		if _, ok := fields["duration_ms"]; ok {
			if err := intField(fields, "duration_ms", &d); err != nil {
				return nil, err
			}
			durationMS = int64(d)
		}
		c.ended = true
		count, trunc := c.count, c.truncated
		return []codeEvent{{Type: "end", ExecutionCount: &count, ContextID: &cid, DurationMS: &durationMS, Truncated: &trunc}}, nil
	case "":
		return nil, errors.New("sent a line without a type")
	}
	return nil, fmt.Errorf("sent a line of unknown type %q", bounded(typ, 64))
}

// output1 is the events of a stdout or stderr line under the cap.
func (c *codeStream) output1(typ, text string) []codeEvent {
	if typ == "stderr" && text == guestTruncatedMarker {
		c.truncated = true
	}
	if c.output >= c.maxOutput {
		// The output reached the cap exactly on an earlier line's end:
		// the marker goes with the first line that does not fit.
		c.truncated = true
		if c.marked {
			return nil
		}
		c.marked = true
		return []codeEvent{c.marker()}
	}
	if c.output+len(text) <= c.maxOutput {
		c.output += len(text)
		return []codeEvent{{Type: typ, Text: &text}}
	}
	keep := text[:c.maxOutput-c.output]
	for len(keep) > 0 && !utf8.ValidString(keep[max(0, len(keep)-utf8.UTFMax):]) {
		keep = keep[:len(keep)-1] // never cut a character in two
	}
	c.output = c.maxOutput
	c.truncated, c.marked = true, true
	var evs []codeEvent
	if keep != "" {
		evs = append(evs, codeEvent{Type: typ, Text: &keep})
	}
	return append(evs, c.marker())
}

// marker is the stderr event that says the output was cut.
func (c *codeStream) marker() codeEvent {
	m := fmt.Sprintf("[output truncated: the cell wrote more than %d bytes; the rest of its output is dropped]", c.maxOutput)
	return codeEvent{Type: "stderr", Text: &m}
}

// resultEvent is the result event of a guest's result line: its known
// keys become MIME types, its extra's entries are added as they are, its
// chart is passed on; values of the wrong JSON type, an extra that is not
// an object of MIME types, base64 that is not, are a broken protocol.
// Keys the API does not know are dropped.
func resultEvent(fields map[string]json.RawMessage) (codeEvent, error) {
	ev := codeEvent{Type: "result", Data: map[string]json.RawMessage{}}
	main := false
	if _, ok := fields["is_main_result"]; ok {
		if err := json.Unmarshal(fields["is_main_result"], &main); err != nil {
			return ev, errors.New("sent a result whose is_main_result is not a boolean")
		}
	}
	ev.IsMainResult = &main
	for key, raw := range fields {
		k, known := resultKeys[key]
		if !known || isNull(raw) {
			continue
		}
		if k.string {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return ev, fmt.Errorf("sent a result whose %s is not a string", key)
			}
			if base64Keys[key] && !isBase64(s) {
				return ev, fmt.Errorf("sent a result whose %s is not base64", key)
			}
		} else if key == "data" && !isObject(raw) {
			return ev, errors.New("sent a result whose data is not an object")
		}
		ev.Data[k.mime] = raw
	}
	if raw, ok := fields["chart"]; ok && !isNull(raw) {
		if !isObject(raw) {
			return ev, errors.New("sent a result whose chart is not an object")
		}
		ev.Chart = raw
	}
	if raw, ok := fields["extra"]; ok && !isNull(raw) {
		var extra map[string]json.RawMessage
		if err := json.Unmarshal(raw, &extra); err != nil || !isObject(raw) {
			return ev, errors.New("sent a result whose extra is not an object")
		}
		for mime, v := range extra {
			if !validMIME(mime) {
				return ev, fmt.Errorf("sent a result with an extra MIME type %q that is not one", bounded(mime, 64))
			}
			if _, dup := ev.Data[mime]; !dup {
				ev.Data[mime] = v
			}
		}
	}
	return ev, nil
}

// stringField sets *dst to fields[key] if it is there and not null; an
// error if it is not a string.
func stringField(fields map[string]json.RawMessage, key string, dst *string) error {
	raw, ok := fields[key]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("sent a line whose %s is not a string", key)
	}
	return nil
}

// intField sets *dst to fields[key], which must be an integer from 0 to
// 2^31-1.
func intField(fields map[string]json.RawMessage, key string, dst *int) error {
	var n int64
	if err := json.Unmarshal(fields[key], &n); err != nil || n < 0 || n > 1<<31-1 {
		return fmt.Errorf("sent a line whose %s is not a count", key)
	}
	*dst = int(n)
	return nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

// isBase64 reports whether s is standard base64 (line breaks allowed, as
// some encoders write them).
func isBase64(s string) bool {
	n := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
			n++
		case c == '=':
			// Padding: only at the end (checked below by the count).
			rest := strings.TrimRight(s[i:], "=\r\n")
			if rest != "" {
				return false
			}
			pad := strings.Count(s[i:], "=")
			return pad <= 2 && (n+pad)%4 == 0
		case c == '\n', c == '\r':
		default:
			return false
		}
	}
	return n%4 != 1
}

// validMIME reports whether s looks like a MIME type: type/subtype of
// token characters (RFC 9110's tchar), at most 255 bytes.
func validMIME(s string) bool {
	if len(s) > 255 {
		return false
	}
	typ, sub, ok := strings.Cut(s, "/")
	return ok && isToken(typ) && isToken(sub)
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validContextID reports whether s is a context id: 1-64 of
// [A-Za-z0-9_-]. Ids from clients are checked before they go into a
// guest's URL; ids from the guest before they are passed on.
func validContextID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// bounded is s cut to at most n bytes (on a character boundary, with an
// ellipsis if cut), valid UTF-8 and without control characters: text from
// a guest or a client, fit for a message.
func bounded(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	cut := false
	if len(s) > n {
		s = s[:n]
		for len(s) > 0 && !utf8.ValidString(s[max(0, len(s)-utf8.UTFMax):]) {
			s = s[:len(s)-1]
		}
		cut = true
	}
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, s)
	if cut {
		s += "…"
	}
	return s
}

// errLineTooLong: a line of the guest's stream went over maxCodeLine.
var errLineTooLong = fmt.Errorf("sent a line longer than %d MiB", maxCodeLine>>20)

// readLine reads one line of at most max bytes (without its newline). At
// the end of the stream it returns what it read and io.EOF (a last line
// without a newline is a line; the empty rest is not).
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 { // +1: the newline
			return nil, errLineTooLong
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return line, nil
		}
		return line, err
	}
}
