package pandastack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// The code interpreter: cells of Python, JavaScript or bash run in
// contexts of a sandbox made from the code-interpreter template
// (docs/sdk-go.md, "Code interpreter"; the REST API's
// /v1/sandboxes/{id}/code).

// RunCodeOptions are the options of Sandbox.RunCode. The callbacks are
// called in the order of the cell's output, from RunCode's goroutine,
// before RunCode returns.
type RunCodeOptions struct {
	// Language runs the cell in the default context of this language:
	// python (the default), javascript or bash, or an alias (python3, py,
	// js, node, nodejs, sh, shell). Not with ContextID.
	Language string
	// ContextID runs the cell in this context (CreateCodeContext).
	ContextID string
	// Env is set for this cell only.
	Env map[string]string
	// Timeout interrupts the cell after this long (whole seconds, 1 s to
	// 1 h; 0: the server's default, 5 min): the Execution's Error is then
	// a TimeoutError and the context lives on.
	Timeout time.Duration
	// OnStdout and OnStderr get the cell's output as it is printed;
	// OnResult each value it displays, and its main result.
	OnStdout func(string)
	OnStderr func(string)
	OnResult func(Result)
}

// Execution is what a cell did.
type Execution struct {
	// Results are the values the cell displayed (plots, display()) and,
	// with IsMainResult, the value of its last expression, in order.
	Results []Result
	Logs    Logs
	// Error is the exception the cell raised (a syntax error too), nil if
	// none. Names the server gives: TimeoutError (past Timeout),
	// KeyboardInterrupt (InterruptCode), KernelDied (the interpreter died:
	// RestartCodeContext), ExitError (bash: the last command failed).
	Error *ExecutionError
	// ExecutionCount is the context's count of cells run (Python's In [N]).
	ExecutionCount int
	// ContextID is the context the cell ran in.
	ContextID string
	// Duration is how long the cell ran.
	Duration time.Duration
	// Truncated: the cell printed more than the server keeps (16 MiB by
	// default); the rest was dropped after a marker line on stderr.
	Truncated bool
}

// Text is the main result's text (text/plain), "" if the cell has none.
func (e *Execution) Text() string {
	for _, r := range e.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// Logs are a cell's stdout and stderr, in the pieces they came in.
type Logs struct {
	Stdout []string
	Stderr []string
}

// ExecutionError is an exception a cell raised. It is an error, for
// callers that want to return it.
type ExecutionError struct {
	Name  string // ZeroDivisionError
	Value string // division by zero
	// Traceback is the traceback, lines joined by "\n", without colours.
	Traceback string
}

func (e *ExecutionError) Error() string {
	if e.Value == "" {
		return e.Name
	}
	return e.Name + ": " + e.Value
}

// Result is a value a cell displayed, in each MIME type it came in. The
// common ones have fields of their own; Data has them all as the server
// sent them (MIME type → JSON value: base64 strings for images and PDF).
type Result struct {
	IsMainResult bool
	Text         string // text/plain
	HTML         string // text/html
	Markdown     string // text/markdown
	SVG          string // image/svg+xml
	LaTeX        string // text/latex
	JavaScript   string // application/javascript
	PNG          []byte // image/png, decoded
	JPEG         []byte // image/jpeg, decoded
	PDF          []byte // application/pdf, decoded
	// JSON is application/json's value; DataFrame a pandas DataFrame as
	// an object of columns (application/vnd.pandastack.data+json); Chart
	// a matplotlib figure's data (type, title, elements). nil when absent.
	JSON      json.RawMessage
	DataFrame json.RawMessage
	Chart     json.RawMessage
	Data      map[string]json.RawMessage
}

// MIME types of Result's fields.
const (
	MIMEText       = "text/plain"
	MIMEHTML       = "text/html"
	MIMEMarkdown   = "text/markdown"
	MIMESVG        = "image/svg+xml"
	MIMELaTeX      = "text/latex"
	MIMEJavaScript = "application/javascript"
	MIMEPNG        = "image/png"
	MIMEJPEG       = "image/jpeg"
	MIMEPDF        = "application/pdf"
	MIMEJSON       = "application/json"
	MIMEDataFrame  = "application/vnd.pandastack.data+json"
)

// Formats lists the MIME types the result came in, sorted.
func (r Result) Formats() []string {
	out := make([]string, 0, len(r.Data))
	for k := range r.Data {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// codeEvent is one line of the code stream (the CodeEvent schema).
type codeEvent struct {
	Type           string                     `json:"type"`
	Text           string                     `json:"text"`
	IsMainResult   bool                       `json:"is_main_result"`
	Data           map[string]json.RawMessage `json:"data"`
	Chart          json.RawMessage            `json:"chart"`
	Name           string                     `json:"name"`
	Value          string                     `json:"value"`
	Traceback      string                     `json:"traceback"`
	ExecutionCount int                        `json:"execution_count"`
	ContextID      string                     `json:"context_id"`
	DurationMS     int64                      `json:"duration_ms"`
	Truncated      bool                       `json:"truncated"`
}

// result is ev as a Result.
func (ev *codeEvent) result() Result {
	r := Result{IsMainResult: ev.IsMainResult, Data: ev.Data, Chart: ev.Chart}
	if r.Data == nil {
		r.Data = map[string]json.RawMessage{}
	}
	str := func(mime string) string {
		var s string
		json.Unmarshal(r.Data[mime], &s) // absent or not a string: ""
		return s
	}
	bin := func(mime string) []byte {
		s := strings.NewReplacer("\n", "", "\r", "").Replace(str(mime))
		if s == "" {
			return nil
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			b, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
		}
		if err != nil {
			return nil // Data keeps what came
		}
		return b
	}
	r.Text, r.HTML, r.Markdown, r.SVG = str(MIMEText), str(MIMEHTML), str(MIMEMarkdown), str(MIMESVG)
	r.LaTeX, r.JavaScript = str(MIMELaTeX), str(MIMEJavaScript)
	r.PNG, r.JPEG, r.PDF = bin(MIMEPNG), bin(MIMEJPEG), bin(MIMEPDF)
	r.JSON, r.DataFrame = r.Data[MIMEJSON], r.Data[MIMEDataFrame]
	return r
}

// RunCode runs a cell of code in the sandbox's code interpreter (a sandbox
// of the code-interpreter template) and returns what it did once it has
// finished; opts' callbacks see it as it runs. An exception of the cell is
// the Execution's Error, not a Go error. Go errors are the API's (an
// *Error: ErrNotFound for a sandbox that is not yours or a context that
// does not exist, code guest_error for a sandbox without a code
// interpreter) and a stream that broke (ErrStreamEnded, or an *Error of
// code guest_error when the code interpreter broke it), returned with
// what the cell did until then. Cancelling ctx interrupts the cell.
func (s *Sandbox) RunCode(ctx context.Context, code string, opts RunCodeOptions) (*Execution, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	body := wire.CodeRequest{Code: code, Language: optional(opts.Language), ContextId: optional(opts.ContextID), Env: optionalMap(opts.Env)}
	if opts.Timeout > 0 {
		secs := int((opts.Timeout + time.Second - 1) / time.Second)
		body.TimeoutSeconds = &secs
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // returning early closes the connection: the cell is interrupted
	req, err := s.c.newRequest(ctx, http.MethodPost, path("sandboxes", s.ID, "code"), nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := s.c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return readCodeStream(resp.Body, opts)
}

// maxCodeEvent bounds one event of the code stream (the server bounds
// the guest's lines at 64 MiB; base64 and escapes add to that).
const maxCodeEvent = 128 << 20

// readCodeStream consumes a code stream until its end.
func readCodeStream(r io.Reader, opts RunCodeOptions) (*Execution, error) {
	ex := &Execution{}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readEventLine(br, maxCodeEvent)
		if err != nil {
			if errors.Is(err, io.EOF) {
				if ex.Error != nil && ex.Error.Name != "GuestError" {
					// The server ended the cell itself (its TimeoutError).
					return ex, nil
				}
				if ex.Error != nil {
					return ex, newError(0, "guest_error", ex.Error.Value)
				}
				return ex, fmt.Errorf("run code: %w before the cell's end", ErrStreamEnded)
			}
			return ex, fmt.Errorf("run code: read the stream: %w", err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev codeEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return ex, fmt.Errorf("run code: decode an event: %w", err)
		}
		switch ev.Type {
		case "stdout":
			ex.Logs.Stdout = append(ex.Logs.Stdout, ev.Text)
			if opts.OnStdout != nil {
				opts.OnStdout(ev.Text)
			}
		case "stderr":
			ex.Logs.Stderr = append(ex.Logs.Stderr, ev.Text)
			if opts.OnStderr != nil {
				opts.OnStderr(ev.Text)
			}
		case "result":
			res := ev.result()
			ex.Results = append(ex.Results, res)
			if opts.OnResult != nil {
				opts.OnResult(res)
			}
		case "error":
			ex.Error = &ExecutionError{Name: ev.Name, Value: ev.Value, Traceback: ev.Traceback}
		case "end":
			ex.ExecutionCount, ex.ContextID, ex.Truncated = ev.ExecutionCount, ev.ContextID, ev.Truncated
			ex.Duration = time.Duration(ev.DurationMS) * time.Millisecond
			return ex, nil
		default:
			// Unknown events are future additions: skip them.
		}
	}
}

// readEventLine reads one line of at most max bytes, without its newline;
// a last line without one counts.
func readEventLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > max+1 {
			return nil, fmt.Errorf("an event longer than %d bytes", max)
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
		return nil, err
	}
}

// CodeContext is a context of the code interpreter: an interpreter with
// its own state (variables, imports, working directory).
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"` // python, javascript or bash
	Cwd      string `json:"cwd"`
	// State is idle, busy (a cell runs) or dead (its interpreter died:
	// RestartCodeContext).
	State string `json:"state"`
}

// CodeContextOptions are a new context's language (default python) and
// working directory (default /home/user).
type CodeContextOptions struct {
	Language string
	Cwd      string
}

// codeContexts is the answer of GET …/code/contexts.
type codeContexts struct {
	Contexts []CodeContext `json:"contexts"`
}

// CreateCodeContext makes a new context in the sandbox's code interpreter.
func (s *Sandbox) CreateCodeContext(ctx context.Context, opts CodeContextOptions) (CodeContext, error) {
	var c CodeContext
	if err := checkID("sandbox", s.ID); err != nil {
		return c, err
	}
	in := wire.CodeContextRequest{Language: optional(opts.Language), Cwd: optional(opts.Cwd)}
	err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "code", "contexts"), nil, in, &c)
	return c, err
}

// ListCodeContexts lists the code interpreter's contexts, the default ones
// included.
func (s *Sandbox) ListCodeContexts(ctx context.Context) ([]CodeContext, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	var out codeContexts
	err := s.c.doJSON(ctx, http.MethodGet, path("sandboxes", s.ID, "code", "contexts"), nil, nil, &out)
	return out.Contexts, err
}

// RestartCodeContext gives context id a fresh interpreter (same id,
// language and working directory); its state is lost.
func (s *Sandbox) RestartCodeContext(ctx context.Context, id string) (CodeContext, error) {
	var c CodeContext
	if err := checkID("sandbox", s.ID); err != nil {
		return c, err
	}
	if err := checkID("context", id); err != nil {
		return c, err
	}
	err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "code", "contexts", id, "restart"), nil, nil, &c)
	return c, err
}

// RemoveCodeContext ends context id's interpreter and forgets it.
func (s *Sandbox) RemoveCodeContext(ctx context.Context, id string) error {
	if err := checkID("sandbox", s.ID); err != nil {
		return err
	}
	if err := checkID("context", id); err != nil {
		return err
	}
	return s.c.doJSON(ctx, http.MethodDelete, path("sandboxes", s.ID, "code", "contexts", id), nil, nil, nil)
}

// InterruptCode interrupts the cell running in context contextID ("":
// python's default context), as Ctrl-C would: its RunCode returns with a
// KeyboardInterrupt Error. It reports whether a cell was running.
func (s *Sandbox) InterruptCode(ctx context.Context, contextID string) (bool, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return false, err
	}
	var out wire.CodeInterruptResult
	in := wire.CodeInterruptRequest{ContextId: optional(contextID)}
	err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "code", "interrupt"), nil, in, &out)
	return out.Interrupted, err
}
