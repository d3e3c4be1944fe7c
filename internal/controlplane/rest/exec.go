package rest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
)

type execRequest struct {
	Cmd            string            `json:"cmd"`
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	User           string            `json:"user"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
	Stdin          *string           `json:"stdin"`
}

const defaultExecTimeout = 60 * time.Second

func (req *execRequest) toGuest() (guestproto.ExecRequest, error) {
	g := guestproto.ExecRequest{Shell: req.Cmd, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: req.User}
	switch {
	case req.Cmd == "" && len(req.Argv) == 0:
		return g, invalid("give cmd (a shell command) or argv (a program and its arguments)")
	case req.Cmd != "" && len(req.Argv) > 0:
		return g, invalid("give cmd or argv, not both")
	}
	if err := controlplane.ValidateLabels("env", req.Env, 256); err != nil {
		return g, err
	}
	if req.Cwd != "" {
		if err := checkPath(req.Cwd); err != nil {
			return g, invalid("cwd: %v", err.(*controlplane.Error).Msg)
		}
	}
	if err := guestproto.ValidateUser(req.User); err != nil {
		return g, invalid("user: %v", err)
	}
	timeout := defaultExecTimeout
	if req.TimeoutSeconds != nil {
		t := *req.TimeoutSeconds
		if t < 0 || math.IsNaN(t) || t > 7*24*3600 {
			return g, invalid("timeout_seconds must be between 0 (no timeout) and 604800")
		}
		timeout = time.Duration(t * float64(time.Second))
	}
	g.TimeoutMS = timeout.Milliseconds()
	g.Stdin = req.Stdin != nil
	if err := g.Validate(); err != nil {
		return g, invalid("%v", err)
	}
	return g, nil
}

// startExec validates the request and starts the process in the caller's
// running sandbox (limitGuest's), recorded in its command history. The process dies if
// ctx ends. The caller calls done with its Wait's outcome.
func (s *Server) startExec(ctx context.Context, r *http.Request) (p host.Process, done func(guestproto.ExecResult, error), err error) {
	var req execRequest
	if err := decodeJSON(r, &req, false); err != nil {
		return nil, nil, err
	}
	g, err := req.toGuest()
	if err != nil {
		return nil, nil, err
	}
	sb, err := s.guestSandbox(r)
	if err != nil {
		return nil, nil, err
	}
	c, err := s.host.Guest(r.Context(), sb.ID)
	if err != nil {
		return nil, nil, err
	}
	p, err = c.StartExec(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	if req.Stdin != nil {
		go func() {
			io.Copy(p.Stdin(), strings.NewReader(*req.Stdin))
			p.Stdin().Close()
		}()
	}
	n := s.cp.StartCommand(sb.ID, controlplane.CommandExec, controlplane.CommandLine(req.Cmd, req.Argv), 0, 0)
	return p, func(res guestproto.ExecResult, err error) {
		if err != nil {
			s.cp.FinishCommand(sb.ID, n, nil, "", -1)
			return
		}
		s.cp.FinishCommand(sb.ID, n, &res.ExitCode, res.Signal, res.DurationMS)
	}, nil
}

// outputChunk is the unit in which buffered exec output is kept and
// charged to the server's output budget.
const outputChunk = 64 << 10

var chunkPool = sync.Pool{New: func() any { b := make([]byte, 0, outputChunk); return &b }}

// capped keeps the first max bytes written, in chunks charged to budget,
// and notes whether more came (or the budget ran out). Free returns the
// chunks.
type capped struct {
	max       int
	budget    *outputBudget
	chunks    []*[]byte
	n         int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if c.n >= c.max {
			c.truncated = true
			break
		}
		if len(c.chunks) == 0 || len(*c.chunks[len(c.chunks)-1]) == outputChunk {
			if !c.budget.take(outputChunk) {
				c.truncated = true
				break
			}
			c.chunks = append(c.chunks, chunkPool.Get().(*[]byte))
		}
		last := c.chunks[len(c.chunks)-1]
		k := min(len(p), outputChunk-len(*last), c.max-c.n)
		*last = append(*last, p[:k]...)
		c.n += k
		p = p[k:]
	}
	return total, nil
}

// Free returns the chunks to the pool and the budget.
func (c *capped) Free() {
	for _, b := range c.chunks {
		*b = (*b)[:0]
		chunkPool.Put(b)
	}
	c.budget.give(int64(len(c.chunks)) * outputChunk)
	c.chunks = nil
}

// writeJSONString writes the kept bytes as a JSON string: invalid UTF-8
// becomes U+FFFD, as strings.ToValidUTF8 would, without making a copy of
// the whole output.
func (c *capped) writeJSONString(w *bufio.Writer) {
	w.WriteByte('"')
	var carry []byte // an incomplete UTF-8 sequence at the end of a chunk
	for i, b := range c.chunks {
		data := *b
		if len(carry) > 0 {
			data = append(carry, data...)
			carry = nil
		}
		if i < len(c.chunks)-1 {
			if k := incompleteSuffix(data); k > 0 {
				carry = append([]byte(nil), data[len(data)-k:]...)
				data = data[:len(data)-k]
			}
		}
		writeJSONEscaped(w, data)
	}
	w.WriteByte('"')
}

// writeJSONEscaped writes b's runes escaped for a JSON string.
func writeJSONEscaped(w *bufio.Writer, b []byte) {
	const hex = "0123456789abcdef"
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size == 1:
			w.WriteString("\ufffd")
		case r == '"' || r == '\\':
			w.WriteByte('\\')
			w.WriteByte(byte(r))
		case r == '\n':
			w.WriteString("\\n")
		case r == '\r':
			w.WriteString("\\r")
		case r == '\t':
			w.WriteString("\\t")
		case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
			w.WriteString("\\u")
			if r > 0xff {
				w.WriteByte(hex[r>>12&0xf])
				w.WriteByte(hex[r>>8&0xf])
			} else {
				w.WriteString("00")
			}
			w.WriteByte(hex[r>>4&0xf])
			w.WriteByte(hex[r&0xf])
		default:
			w.Write(b[:size])
		}
		b = b[size:]
	}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	p, done, err := s.startExec(r.Context(), r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stdout := &capped{max: s.cfg.MaxExecOutputBytes, budget: s.output}
	stderr := &capped{max: s.cfg.MaxExecOutputBytes, budget: s.output}
	defer stdout.Free()
	defer stderr.Free()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(stdout, p.Stdout()) }()
	go func() { defer wg.Done(); io.Copy(stderr, p.Stderr()) }()
	wg.Wait()
	res, err := p.Wait()
	done(res, err)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.metrics.execSeconds.Observe(time.Since(t0).Seconds())
	// The answer is written as it is encoded: output is never copied into
	// one string (up to 2 × MaxExecOutputBytes, and JSON escapes can make
	// it several times larger).
	head, _ := json.Marshal(execResult{
		ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, DurationMS: res.DurationMS,
		Truncated: stdout.truncated || stderr.truncated,
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	bw.Write(head[:len(head)-1]) // without its closing brace
	bw.WriteString(`,"stdout":`)
	stdout.writeJSONString(bw)
	bw.WriteString(`,"stderr":`)
	stderr.writeJSONString(bw)
	bw.WriteString("}\n")
	bw.Flush()
}

// execResult is the buffered exec's answer (stdout and stderr are written
// after these fields, by exec).
type execResult struct {
	ExitCode   int    `json:"exit_code"`
	DurationMS int64  `json:"duration_ms"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out"`
	Truncated  bool   `json:"truncated"`
}

type execEvent struct {
	Type       string       `json:"type"`
	PID        int          `json:"pid,omitempty"`
	Data       string       `json:"data,omitempty"`
	ExitCode   *int         `json:"exit_code,omitempty"`
	Signal     string       `json:"signal,omitempty"`
	TimedOut   *bool        `json:"timed_out,omitempty"`
	DurationMS *int64       `json:"duration_ms,omitempty"`
	Error      *errorDetail `json:"error,omitempty"`
}

// ndjson writes events, one per line, flushing each; safe for concurrent use.
type ndjson struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder
	err error
}

func (n *ndjson) send(ev any) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if err := n.enc.Encode(ev); err != nil {
		n.err = err
		return err
	}
	if err := n.rc.Flush(); err != nil {
		n.err = err
	}
	return n.err
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	n := &ndjson{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	n.rc.Flush()
	return n
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	p, done, err := s.startExec(ctx, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newNDJSON(w)
	out.send(execEvent{Type: "start", PID: p.PID()})
	var wg sync.WaitGroup
	pump := func(kind string, rd io.Reader) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		var carry []byte // an incomplete UTF-8 sequence from the last read
		for {
			n, err := rd.Read(buf)
			if n > 0 {
				data := append(carry, buf[:n]...)
				cut := len(data) - incompleteSuffix(data)
				carry = append([]byte(nil), data[cut:]...)
				if cut > 0 {
					if out.send(execEvent{Type: kind, Data: strings.ToValidUTF8(string(data[:cut]), "\uFFFD")}) != nil {
						cancel() // the client went away: kill the command
						io.Copy(io.Discard, rd)
						return
					}
				}
			}
			if err != nil {
				if len(carry) > 0 {
					out.send(execEvent{Type: kind, Data: strings.ToValidUTF8(string(carry), "\uFFFD")})
				}
				return
			}
		}
	}
	wg.Add(2)
	go pump("stdout", p.Stdout())
	go pump("stderr", p.Stderr())
	wg.Wait()
	res, err := p.Wait()
	done(res, err)
	if err != nil {
		ae := classify(err)
		out.send(execEvent{Type: "error", Error: &errorDetail{Code: ae.Code, Message: ae.Message}})
		return
	}
	s.metrics.execSeconds.Observe(time.Since(t0).Seconds())
	out.send(execEvent{Type: "exit", ExitCode: &res.ExitCode, Signal: res.Signal, TimedOut: &res.TimedOut, DurationMS: &res.DurationMS})
}

// incompleteSuffix returns how many trailing bytes of b start a UTF-8
// sequence that is not complete yet (0 to 3).
func incompleteSuffix(b []byte) int {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return 0 // ASCII: complete
		}
		if utf8.RuneStart(c) {
			need := 0
			switch {
			case c&0xE0 == 0xC0:
				need = 2
			case c&0xF0 == 0xE0:
				need = 3
			case c&0xF8 == 0xF0:
				need = 4
			default:
				return 0
			}
			if i < need {
				return i
			}
			return 0
		}
	}
	return 0
}
