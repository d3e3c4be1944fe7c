package rest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// The code interpreter (api/openapi.yaml, /v1/sandboxes/{id}/code…): cells
// of Python, JavaScript or bash run in contexts of the sandbox's code
// server, the guest's HTTP server on codePort that the code-interpreter
// template starts (docs/api.md, "Code interpreter"). The handlers reach it
// over the port proxy's transport (proxy.go: the host's DialGuest, over
// the sandbox's network or, without one, through its guest agent; its
// pool of connections per sandbox and port, closed when the sandbox
// stops), never with the caller's credentials. They are guest requests:
// limitGuest has found the caller's running sandbox (404 before the body
// is read) and holds a slot of it and of the key for the request's life.
// What the guest answers is untrusted: bodies are bounded and validated,
// its messages are cut and cleaned before users see them, and its stream
// is translated line by line (codeevents.go).

// codePort is the code server's port in the guest.
const codePort = 49999

// Bounds of a cell's timeout (timeout_seconds) and its default.
const (
	defaultCodeTimeout = 300 * time.Second
	maxCodeTimeout     = 3600 * time.Second
)

// codeTimeoutGrace is how long past a cell's timeout the server waits for
// the guest's own TimeoutError before it interrupts the cell itself and
// ends the stream (Server.codeGrace; tests shorten it).
const codeTimeoutGrace = 15 * time.Second

// Bounds of what the guest answers outside a cell's stream.
const (
	maxCodeReply     = 1 << 20 // a context, a list of them, an interrupt
	maxGuestMessage  = 512     // an error message of the guest shown to users
	codeCallTimeout  = 2 * time.Minute
	maxCodeLanguages = 64
)

// codeLanguages maps the languages and aliases the code server knows to
// their canonical names.
var codeLanguages = map[string]string{
	"python": "python", "python3": "python", "py": "python",
	"javascript": "javascript", "js": "javascript", "node": "javascript", "nodejs": "javascript",
	"bash": "bash", "sh": "bash", "shell": "bash",
}

// canonicalLanguage returns l's canonical name ("" for ""), or a 400
// naming the languages there are.
func canonicalLanguage(l string) (string, error) {
	if l == "" {
		return "", nil
	}
	if c, ok := codeLanguages[strings.ToLower(l)]; ok {
		return c, nil
	}
	return "", badRequest("unknown language %q: python, javascript, bash", bounded(l, maxCodeLanguages))
}

// codeRequest is the body of POST /v1/sandboxes/{id}/code.
type codeRequest struct {
	Code           *string           `json:"code"`
	Language       string            `json:"language"`
	ContextID      string            `json:"context_id"`
	Env            map[string]string `json:"env"`
	TimeoutSeconds *int              `json:"timeout_seconds"`
}

// guestExecute is the body of the code server's POST /execute.
type guestExecute struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	TimeoutMS int64             `json:"timeout_ms"`
}

// toGuest validates req and returns the guest's request and the cell's
// timeout.
func (req *codeRequest) toGuest() (guestExecute, time.Duration, error) {
	var g guestExecute
	if req.Code == nil {
		return g, 0, invalid("code is required: the cell's source")
	}
	g.Code = *req.Code
	if req.Language != "" && req.ContextID != "" {
		return g, 0, badRequest("give language or context_id, not both: a context has its language")
	}
	lang, err := canonicalLanguage(req.Language)
	if err != nil {
		return g, 0, err
	}
	g.Language = lang
	if req.ContextID != "" && !validContextID(req.ContextID) {
		return g, 0, invalid("context_id %q is not a context id (1-64 letters, digits, _ and -)", bounded(req.ContextID, 64))
	}
	g.ContextID = req.ContextID
	if err := controlplane.ValidateLabels("env", req.Env, 256); err != nil {
		return g, 0, err
	}
	g.EnvVars = req.Env
	timeout := defaultCodeTimeout
	if req.TimeoutSeconds != nil {
		t := time.Duration(*req.TimeoutSeconds) * time.Second
		if *req.TimeoutSeconds < 1 || t > maxCodeTimeout {
			return g, 0, invalid("timeout_seconds must be between 1 and %d", int(maxCodeTimeout.Seconds()))
		}
		timeout = t
	}
	g.TimeoutMS = timeout.Milliseconds()
	return g, timeout, nil
}

// codeContextRequest is the body of POST …/code/contexts.
type codeContextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// guestContextRequest is the body of the code server's POST /contexts.
type guestContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}

// codeContextJSON is a context (the CodeContext schema), as the guest
// answers it and the API does.
type codeContextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	State    string `json:"state"`
}

// check validates a context the guest described.
func (c *codeContextJSON) check() error {
	switch {
	case !validContextID(c.ID):
		return errors.New("described a context with an invalid id")
	case c.Language != "python" && c.Language != "javascript" && c.Language != "bash":
		return errors.New("described a context of an unknown language")
	case checkPath(c.Cwd) != nil:
		return errors.New("described a context whose cwd is not an absolute path")
	}
	switch c.State {
	case "idle", "busy", "dead":
		return nil
	case "":
		c.State = "idle" // E2B's servers do not say
		return nil
	}
	return errors.New("described a context in an unknown state")
}

// codeContextList is the answer of GET …/code/contexts.
type codeContextList struct {
	Contexts []codeContextJSON `json:"contexts"`
}

// codeInterruptRequest is the body of POST …/code/interrupt.
type codeInterruptRequest struct {
	ContextID string `json:"context_id"`
}

// codeInterruptResult is its answer, and the guest's.
type codeInterruptResult struct {
	Interrupted bool `json:"interrupted"`
}

// errNoCodeDialer: the host cannot open connections to its guests at all
// (every host agent can; a host.Host without GuestDialer).
var errNoCodeDialer = errorf(controlplane.NotImplemented,
	"this server cannot reach the code interpreter: its host cannot connect to ports in sandboxes")

// errCodeOldAgent: the host has no network to its guests and reaches their
// ports through their guest agents, but this one is too old for it.
var errCodeOldAgent = errorf(controlplane.NotImplemented,
	"this server reaches the code interpreter through the sandbox's guest agent (its host has no sandbox networking), and this sandbox's is too old for it: recreate the sandbox from a current template")

// codeGuest is a sandbox's code server, reached over the port proxy's
// transport.
type codeGuest struct {
	s  *Server
	sb catalog.Sandbox
}

// codeGuestOf returns the code server of the caller's running sandbox
// (limitGuest's), or 501 when the host cannot reach its guests' ports.
func (s *Server) codeGuestOf(r *http.Request) (*codeGuest, error) {
	sb, err := s.guestSandbox(r)
	if err != nil {
		return nil, err
	}
	if s.proxy.dialer == nil {
		return nil, errNoCodeDialer
	}
	return &codeGuest{s: s, sb: sb}, nil
}

// do sends a request to the code server and returns its answer when it
// is 2xx; any other answer is turned into the API's error (a 400 or 404
// of the guest with its message, cut and cleaned; anything else 502).
// body is JSON-encoded unless nil.
func (g *codeGuest) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("encode code server request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	u := "http://" + net.JoinHostPort(g.sb.ID, strconv.Itoa(codePort)) + path
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("code server request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := g.s.proxy.tr.RoundTrip(req)
	if err != nil {
		return nil, g.classify(err)
	}
	if res.StatusCode/100 == 2 {
		return res, nil
	}
	defer res.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(res.Body, maxGuestMessage+64))
	text := bounded(strings.TrimSpace(string(msg)), maxGuestMessage)
	if text == "" {
		text = http.StatusText(res.StatusCode)
	}
	switch res.StatusCode {
	case http.StatusBadRequest:
		return nil, badRequest("%s", text)
	case http.StatusNotFound:
		return nil, notFound("%s", text)
	}
	return nil, errorf(controlplane.GuestError, "the code interpreter of sandbox %s answered %d: %s", g.sb.ID, res.StatusCode, text)
}

// classify turns a failure to reach the code server into what users see.
func (g *codeGuest) classify(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return err
	case errors.Is(err, errors.ErrUnsupported):
		return errCodeOldAgent
	case guestproto.CodeOf(err) == guestproto.CodeBusy:
		return errorf(controlplane.TooManyRequests, "too many connections to the ports of sandbox %s at once; retry when some have closed", g.sb.ID)
	case errors.Is(err, syscall.ECONNREFUSED):
		return errorf(controlplane.GuestError, "sandbox %s has no code interpreter: create it from the code-interpreter template", g.sb.ID)
	case errors.Is(err, host.ErrUnavailable), errors.Is(err, host.ErrNotFound), errors.Is(err, host.ErrConflict),
		errors.Is(err, host.ErrInvalid), errors.Is(err, host.ErrNotReady):
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return errorf(controlplane.Timeout, "the code interpreter of sandbox %s did not answer in time", g.sb.ID)
	}
	return errorf(controlplane.GuestError, "the code interpreter of sandbox %s failed: %s", g.sb.ID, bounded(err.Error(), 256))
}

// call sends a request whose answer is JSON (out) or nothing (out nil),
// bounded by codeCallTimeout.
func (g *codeGuest) call(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, codeCallTimeout)
	defer cancel()
	res, err := g.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxCodeReply+1))
	if err != nil {
		return g.classify(err)
	}
	if out == nil {
		return nil
	}
	if len(b) > maxCodeReply {
		return errorf(controlplane.GuestError, "the code interpreter of sandbox %s answered more than %d bytes", g.sb.ID, maxCodeReply)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return errorf(controlplane.GuestError, "the code interpreter of sandbox %s answered malformed JSON", g.sb.ID)
	}
	return nil
}

// contexts lists the code server's contexts, checked.
func (g *codeGuest) contexts(ctx context.Context) ([]codeContextJSON, error) {
	var list []codeContextJSON
	if err := g.call(ctx, http.MethodGet, "/contexts", nil, &list); err != nil {
		return nil, err
	}
	for i := range list {
		if err := list[i].check(); err != nil {
			return nil, g.broke(err)
		}
	}
	if list == nil {
		list = []codeContextJSON{}
	}
	return list, nil
}

// broke is the error of a code server that broke its protocol (err says
// how, as codeevents.go's errors do: "sent …", "described …").
func (g *codeGuest) broke(err error) error {
	return errorf(controlplane.GuestError, "the code interpreter of sandbox %s %v", g.sb.ID, err)
}

// defaultContext returns the id of language's default context: the
// guest's "default-LANGUAGE" (the code server's name for it) or
// "LANGUAGE" if it lists one, else the first of that language it lists
// (a code server makes its default contexts first). "" if it has none
// (the next cell of the language makes one).
func (g *codeGuest) defaultContext(ctx context.Context, language string) (string, error) {
	list, err := g.contexts(ctx)
	if err != nil {
		return "", err
	}
	first, named := "", ""
	for _, c := range list {
		switch {
		case c.Language != language:
		case c.ID == "default-"+language:
			return c.ID, nil
		case c.ID == language:
			named = c.ID
		case first == "":
			first = c.ID
		}
	}
	if named != "" {
		return named, nil
	}
	return first, nil
}

// interrupt interrupts the cell running in context cid.
func (g *codeGuest) interrupt(ctx context.Context, cid string) (bool, error) {
	var res codeInterruptResult
	err := g.call(ctx, http.MethodPost, "/contexts/"+cid+"/interrupt", struct{}{}, &res)
	return res.Interrupted, err
}

// contextParam reads the {contextID} path parameter: a context id, or 404.
func contextParam(r *http.Request) (string, error) {
	cid := chi.URLParam(r, "contextID")
	if !validContextID(cid) {
		return "", notFound("context %q not found", bounded(cid, 64))
	}
	return cid, nil
}

// runCode serves POST /v1/sandboxes/{id}/code: the cell's events as the
// guest streams them, translated.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	var req codeRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	greq, timeout, err := req.toGuest()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// The guest's request ends with the client's (the guest interrupts
	// the cell when its connection closes, or takes it out of its
	// context's queue), or at the host's deadline.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	answer := make(chan error, 1)
	lines := make(chan lineOrErr)
	go func() {
		defer close(lines)
		res, err := g.do(ctx, http.MethodPost, "/execute", greq)
		answer <- err
		if err != nil {
			return
		}
		defer res.Body.Close()
		br := bufio.NewReaderSize(res.Body, 64<<10)
		for {
			b, err := readLine(br, maxCodeLine)
			select {
			case lines <- lineOrErr{b, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	deadline := time.NewTimer(time.Until(t0.Add(timeout + s.codeGrace)))
	defer deadline.Stop()
	var out *ndjson // nil until the guest answered
	timedOut := func() {
		s.codeTimedOut(g, greq, timeout)
		cancel()
		if out == nil {
			out = newNDJSON(w)
		}
		out.send(errorEvent(codeTimeoutError, fmt.Sprintf("the cell ran past its timeout of %s and was interrupted", timeout), ""))
	}
	select {
	case err := <-answer:
		if err != nil {
			if r.Context().Err() == nil {
				s.writeError(w, r, err)
			}
			return
		}
	case <-deadline.C:
		timedOut()
		return
	case <-r.Context().Done():
		return // the client left: cancel closes the guest's connection
	}
	out = newNDJSON(w)
	cs := &codeStream{maxOutput: s.cfg.MaxExecOutputBytes, contextID: greq.ContextID}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-deadline.C:
			timedOut()
			return
		case l, ok := <-lines:
			if !ok {
				return
			}
			if l.err != nil {
				if r.Context().Err() != nil {
					return
				}
				if errors.Is(l.err, errLineTooLong) {
					out.send(guestStreamError("%v", l.err))
				} else {
					out.send(guestStreamError("ended its stream before the cell's end"))
				}
				return
			}
			evs, err := cs.line(l.b, time.Since(t0).Milliseconds())
			if err != nil {
				s.log.Warn("code interpreter broke its protocol", "sandbox_id", g.sb.ID, "err", err)
				out.send(guestStreamError("%v", err))
				return
			}
			for _, ev := range evs {
				if out.send(ev) != nil {
					return // the client left
				}
			}
			if cs.ended {
				return
			}
		}
	}
}

// lineOrErr is a line of the guest's stream, or why there is no more.
type lineOrErr struct {
	b   []byte
	err error
}

// codeTimedOut interrupts a cell whose guest let it run past its timeout
// and the grace: in its context (the request's, or the language's
// default), before its connection is closed, so that the interrupt is for
// this cell and not the next one of the context's queue.
func (s *Server) codeTimedOut(g *codeGuest, req guestExecute, timeout time.Duration) {
	s.log.Warn("code interpreter let a cell run past its timeout", "sandbox_id", g.sb.ID, "timeout_s", timeout.Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cid := req.ContextID
	if cid == "" {
		lang := req.Language
		if lang == "" {
			lang = "python"
		}
		var err error
		if cid, err = g.defaultContext(ctx, lang); err != nil || cid == "" {
			return
		}
	}
	if _, err := g.interrupt(ctx, cid); err != nil {
		s.log.Debug("interrupt a cell past its timeout", "sandbox_id", g.sb.ID, "err", err)
	}
}

// createCodeContext serves POST …/code/contexts.
func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) {
	var req codeContextRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	lang, err := canonicalLanguage(req.Language)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Cwd != "" {
		if err := checkPath(req.Cwd); err != nil {
			s.writeError(w, r, invalid("cwd: %v", err.(*controlplane.Error).Msg))
			return
		}
	}
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var c codeContextJSON
	if err := g.call(r.Context(), http.MethodPost, "/contexts", guestContextRequest{Language: lang, Cwd: req.Cwd}, &c); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := c.check(); err != nil {
		s.writeError(w, r, g.broke(err))
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// listCodeContexts serves GET …/code/contexts.
func (s *Server) listCodeContexts(w http.ResponseWriter, r *http.Request) {
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := g.contexts(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, codeContextList{Contexts: list})
}

// restartCodeContext serves POST …/code/contexts/{contextID}/restart.
func (s *Server) restartCodeContext(w http.ResponseWriter, r *http.Request) {
	cid, err := contextParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var c codeContextJSON
	if err := g.call(r.Context(), http.MethodPost, "/contexts/"+cid+"/restart", struct{}{}, &c); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := c.check(); err != nil {
		s.writeError(w, r, g.broke(err))
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// removeCodeContext serves DELETE …/code/contexts/{contextID}.
func (s *Server) removeCodeContext(w http.ResponseWriter, r *http.Request) {
	cid, err := contextParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := g.call(r.Context(), http.MethodDelete, "/contexts/"+cid, nil, nil); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// interruptCode serves POST …/code/interrupt.
func (s *Server) interruptCode(w http.ResponseWriter, r *http.Request) {
	var req codeInterruptRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.ContextID != "" && !validContextID(req.ContextID) {
		s.writeError(w, r, invalid("context_id %q is not a context id (1-64 letters, digits, _ and -)", bounded(req.ContextID, 64)))
		return
	}
	g, err := s.codeGuestOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cid := req.ContextID
	if cid == "" {
		if cid, err = g.defaultContext(r.Context(), "python"); err != nil {
			s.writeError(w, r, err)
			return
		}
		if cid == "" { // no default python context: nothing runs there
			writeJSON(w, http.StatusOK, codeInterruptResult{})
			return
		}
	}
	done, err := g.interrupt(r.Context(), cid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, codeInterruptResult{Interrupted: done})
}
