// Package hostapi is the internal HTTP/JSON API between the control plane
// (`panda server`) and a host agent (`panda agent`): NewServer exposes one
// agent.Agent under /host/v1, and Client implements host.Host over it, so that
// the REST API runs the same against a remote host as against the local one.
//
// Transport and credentials: the agent serves the API over TLS 1.3
// (HTTP/1.1) with a certificate signed by a CA of its own, made on first
// start (LoadOrCreateTLS); the control plane trusts that CA only, for that
// agent (ClientTLS, WithTLS), and sends the agent's own token: every request
// but GET /healthz carries `Authorization: Bearer <agent token>`, compared
// in constant time. Each agent has its own CA, certificate and token.
//
// Errors travel
// as {"error": {"code", "message"}}; the code names the error class (the
// agent's, the template store's, a guest's *guestproto.Error, a timeout), and
// the client rebuilds an error of that same class with the same text, so the
// API's error classification does not know whether the host is remote.
//
// Streams:
//   - exec (POST …/exec) is full duplex over one HTTP request: the request
//     body is one JSON line (the guestproto.ExecRequest, of any length up to
//     MaxLine) followed by the raw bytes of stdin; the response is a sequence of frames (a type byte, a
//     big-endian uint32 length, the payload): start {"pid"}, stdout and
//     stderr bytes, then exit (guestproto.ExecResult) or error. The server
//     enables full duplex (http.ResponseController.EnableFullDuplex) so
//     that it reads stdin while it writes output; Go's client sends a
//     streamed request body concurrently with reading the response and
//     flushes every chunk. The same handler works unchanged over HTTP/2.
//     Closing the connection (the client's context ending) kills the
//     process, as cancelling guestproto's StartExec does.
//   - read file (GET …/files) answers one JSON line (the guestproto.FileInfo,
//     at most MaxLine) and the file's bytes; an error after the first byte arrives in the
//     X-Panda-Error trailer, so a failed download is never a short file.
//   - write file (PUT …/files) streams the request body into the guest.
//   - snapshot packs (host.DirectTransferer; the format is
//     chunkstore's): GET …/snapshots/{id}/pack answers the pack of a
//     snapshot the agent holds as the body, an error after the first
//     byte in the X-Panda-Error trailer (and the pack lacks its trailer
//     record, so a receiver refuses it anyway); ?held=<id>,… names the
//     durable snapshots the requester holds, one of which the pack may
//     be diffed against (agent.Agent.SendSnapshot); POST …/snapshots/{id}/pack
//     streams a pack up (full duplex: a refusal — template_not_found when
//     the agent lacks the capture's template, conflict — is answered
//     before the body is read to its end) and answers the snapshot kept
//     (FetchedBytes: the pack's length), or corrupt if the stream was
//     cut short or damaged. Neither is buffered whole on either side.
//     POST …/snapshots/{id}/pack/create receives a pack and creates a
//     sandbox from it at once (host.PackCreator): the body is the create
//     request as one JSON line, then the pack; the sandbox's VMM starts
//     while the pack arrives. It answers {"sandbox", "snapshot"}, or an
//     error — with X-Panda-Snapshot-Kept: true if the pack was received
//     and kept as the snapshot (only the create failed).
//   - template bake and the event stream (GET /host/v1/events) are NDJSON;
//     so is a create (POST /host/v1/sandboxes) with ?progress=1: its
//     progress lines, then done with the sandbox's Info, or error.
//   - the user templates' sets in the agent's object store: GET
//     /user-templates/stored lists them ("NAME:N"), DELETE
//     /user-templates/stored/{name}/{version} deletes one (the control
//     plane's sweep of versions its registry no longer has).
//   - background processes (…/processes: start, list; …/processes/{pid}:
//     delete, stdin (raw body, at most MaxStdinBody; ?close=true closes
//     stdin after it), signal, resize, wait, attach). Attach
//     (GET …/processes/{pid}/attach?stdout_offset=N&stderr_offset=N, -1:
//     from now) answers frames as exec does: attach {start, proc} first,
//     stdout and stderr bytes, then attach end {proc, lagged} (same type
//     byte as exec's exit) or error; closing the connection detaches and
//     the process runs on. Wait (POST …/wait) answers the ProcInfo once the
//     process has exited.
//   - watch (GET …/sandboxes/{id}/watch?path=P&recursive=B) answers 200
//     once the guest's watches are in place, then NDJSON: one
//     guestproto.WatchEvent a line, and last {"type":"end"} (the guest
//     ended the watch: the directory was removed) or {"type":"error",
//     "error":{…}}.
//   - attach, wait and watch last as long as the process or the client:
//     no body that may idle, no write timeout; like event streams and
//     dials they are not requests in flight for Shutdown, and Close ends
//     them.
//   - dial (GET …/sandboxes/{id}/dial?port=N, with Connection: Upgrade and
//     Upgrade: panda-tcp) opens a TCP connection to port N of the guest
//     (agent.Agent.DialGuest) and answers 101 Switching Protocols; from
//     then on the connection, still inside its TLS session, carries that
//     TCP connection's bytes both ways, unframed, until either side
//     closes. A side that finishes sending half-closes (TLS close_notify
//     towards the client, FIN towards the guest) and can still read the
//     other's answer. A dial that fails is an ordinary error answer:
//     not_found, conflict (the sandbox is not running), invalid (port),
//     refused (nothing listens on the port), timeout, unsupported (the
//     host has no sandbox networking). Client.DialGuest makes a new
//     connection to the agent per dial, never reused: the control plane's
//     port proxy pools the connections it gets. Dials are not requests in
//     flight for Shutdown; Close ends them.
//
// The event stream tells the control plane what it cannot ask for: a sandbox
// whose VMM died (the agent's OnExit) or that the agent stopped as it shut
// down. Its first event is hello (the host's accelerator and template
// defaults), then exit events, and a ping every PingInterval. A client
// reconnects when the stream breaks and reconciles with List on every
// (re)connect, since events sent while it was away are lost.
package hostapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Prefix is the path prefix of every endpoint.
const Prefix = "/host/v1"

// PingInterval is how often the event stream sends a ping; a client that
// hears nothing for three intervals reconnects.
const PingInterval = 10 * time.Second

// MaxStoredWait bounds the wait of one AwaitStored call (GET
// /snapshots/{id}/stored?wait_ms=N): a caller that wants to wait longer
// asks again.
const MaxStoredWait = time.Minute

// ErrUnauthorized: the agent rejected the token.
var ErrUnauthorized = errors.New("host agent rejected the token")

// Info describes a host agent: what host.Host's Accel and TemplateParams
// answer.
type Info struct {
	Accel accel.Accel `json:"accel"`
	// Defaults are the template parameters of a request that names none
	// (TemplateParams("", 0, 0)).
	Defaults templates.Params `json:"defaults"`
	// Resources are the host machine's, when the info was sent.
	Resources host.Resources `json:"resources"`
	// NetworkOff: the agent runs without sandbox networking (an older
	// agent sends nothing: taken as networking on).
	NetworkOff bool `json:"network_off,omitempty"`
}

// Event is one line of the event stream.
type Event struct {
	Type string `json:"type"` // hello, exit or ping
	Info *Info  `json:"info,omitempty"`
	// ID, Reason and Error describe an exit: Reason is vmm_exited (the
	// VMM died by itself) or host_shutdown (the agent stopped it as it
	// shut down).
	ID     string `json:"id,omitempty"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

const (
	reasonExited   = "vmm_exited"
	reasonShutdown = "host_shutdown"
)

// wireCreate is req on the wire.
func wireCreate(req host.CreateRequest) createRequest {
	return createRequest{ID: req.ID, Template: req.Template, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs, Env: req.Env,
		SnapshotID: req.SnapshotID, Owner: req.Owner, Network: req.Network}
}

// host is the create request r carries.
func (r createRequest) host() host.CreateRequest {
	return host.CreateRequest{ID: r.ID, Template: r.Template, MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, Env: r.Env,
		SnapshotID: r.SnapshotID, Owner: r.Owner, Network: r.Network}
}

// headerSnapshotKept, "true" on an error answer of POST
// …/snapshots/{id}/pack/create, says the pack was received and kept as
// the snapshot: only the create failed.
const headerSnapshotKept = "X-Panda-Snapshot-Kept"

// wire types of requests and replies.
type (
	createRequest struct {
		ID         string            `json:"id"`
		Template   string            `json:"template,omitempty"`
		MemoryMiB  int               `json:"memory_mib,omitempty"`
		VCPUs      int               `json:"vcpus,omitempty"`
		Env        map[string]string `json:"env,omitempty"`
		SnapshotID string            `json:"snapshot_id,omitempty"`
		Owner      string            `json:"owner,omitempty"`
		Network    netpolicy.Policy  `json:"network"`
	}
	// pullRequest is the body of POST …/snapshots/{id}/pack/pull.
	pullRequest struct {
		Create createRequest   `json:"create"`
		From   host.PackSource `json:"from"`
	}
	// packCreateResponse answers POST …/snapshots/{id}/pack/create and
	// …/pack/pull.
	packCreateResponse struct {
		Sandbox  host.Info         `json:"sandbox"`
		Snapshot host.SnapshotInfo `json:"snapshot"`
	}
	forkRequest struct {
		IDs []string `json:"ids"`
	}
	forkChild struct {
		Info  host.Info  `json:"info"`
		Error *wireError `json:"error,omitempty"`
	}
	forkReply struct {
		Children []forkChild       `json:"children"`
		Capture  host.CaptureStats `json:"capture"`
	}
	snapshotRequest struct {
		SnapshotID string `json:"snapshot_id"`
	}
	lookupReply struct {
		Template    *templates.Meta `json:"template"`
		StaleReason string          `json:"stale_reason,omitempty"`
	}
	// bakeEvent is a line of a bake's stream, and of a create's that asked
	// for its progress (?progress=1): done carries the template of a bake,
	// the sandbox's Info of a create.
	bakeEvent struct {
		Type     string          `json:"type"` // progress, done or error
		Message  string          `json:"message,omitempty"`
		Template *templates.Meta `json:"template,omitempty"`
		Info     *host.Info      `json:"info,omitempty"`
		Error    *wireError      `json:"error,omitempty"`
	}
	pathRequest struct {
		Path string `json:"path"`
	}
	renameRequest struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	writeReply struct {
		Written int64 `json:"written"`
	}
	startFrame struct {
		PID int `json:"pid"`
	}
)

// capture fills in CaptureStats.Paused, which travels as PausedMS.
func capture(st host.CaptureStats) host.CaptureStats {
	st.Paused = time.Duration(st.PausedMS * float64(time.Millisecond))
	return st
}

// Error classes, in the order the API classifies them (internal/controlplane/rest
// classify), so that an error matching several is sent as the class that
// decides its HTTP status.
var classes = []struct {
	code   string
	status int
	class  error
}{
	{"no_space", http.StatusInsufficientStorage, host.ErrNoSpace},
	{"builds_unsupported", http.StatusNotImplemented, builds.ErrUnsupported},
	{"template_limit", http.StatusTooManyRequests, builds.ErrLimit},
	{"builds_busy", http.StatusTooManyRequests, builds.ErrBusy},
	{"builds_no_space", http.StatusInsufficientStorage, builds.ErrNoSpace},
	{"builds_closed", http.StatusServiceUnavailable, builds.ErrClosed},
	{"build_not_found", http.StatusNotFound, builds.ErrNotFound},
	{"corrupt", http.StatusConflict, host.ErrCorrupt},
	{"not_ready", http.StatusServiceUnavailable, host.ErrNotReady},
	{"not_found", http.StatusNotFound, host.ErrNotFound},
	{"template_not_found", http.StatusNotFound, templates.ErrNotFound},
	{"invalid", http.StatusUnprocessableEntity, host.ErrInvalid},
	{"template_invalid", http.StatusUnprocessableEntity, templates.ErrInvalid},
	{"conflict", http.StatusConflict, host.ErrConflict},
	{"build_conflict", http.StatusConflict, builds.ErrConflict},
	{"template_conflict", http.StatusConflict, templates.ErrConflict},
	{"unavailable", http.StatusServiceUnavailable, host.ErrUnavailable},
	{"unsupported", http.StatusNotImplemented, errors.ErrUnsupported},
	{"refused", http.StatusBadGateway, syscall.ECONNREFUSED}, // nothing listens on a guest's port
	{"timeout", http.StatusGatewayTimeout, context.DeadlineExceeded},
	{"canceled", http.StatusServiceUnavailable, context.Canceled},
	{"unauthorized", http.StatusUnauthorized, ErrUnauthorized},
}

// guestCodePrefix marks the code of a *guestproto.Error ("guest.not_found").
const guestCodePrefix = "guest."

type errorBody struct {
	Error wireError `json:"error"`
}

type wireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// GuestMessage is the guest's own message of a guest error.
	GuestMessage string `json:"guest_message,omitempty"`
}

// encodeError classifies err for the wire.
func encodeError(err error) (int, wireError) {
	for _, c := range classes {
		if errors.Is(err, c.class) {
			return c.status, wireError{Code: c.code, Message: err.Error()}
		}
	}
	var ge *guestproto.Error
	if errors.As(err, &ge) {
		status := http.StatusUnprocessableEntity
		switch ge.Code {
		case guestproto.CodeNotFound:
			status = http.StatusNotFound
		case guestproto.CodeExists, guestproto.CodeNotEmpty:
			status = http.StatusConflict
		case guestproto.CodePermission:
			status = http.StatusForbidden
		case guestproto.CodeInternal, guestproto.CodeCanceled:
			status = http.StatusInternalServerError
		}
		return status, wireError{Code: guestCodePrefix + string(ge.Code), Message: err.Error(), GuestMessage: ge.Message}
	}
	return http.StatusInternalServerError, wireError{Code: "internal", Message: err.Error()}
}

// remoteError is an error the agent reported: its text, and the class it
// had there (nil for internal errors).
type remoteError struct {
	msg   string
	class error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.class }

// decodeError rebuilds the error the agent sent.
func (we wireError) err() error {
	re := &remoteError{msg: we.Message}
	if re.msg == "" {
		re.msg = we.Code
	}
	for _, c := range classes {
		if c.code == we.Code {
			re.class = c.class
			return re
		}
	}
	if len(we.Code) > len(guestCodePrefix) && we.Code[:len(guestCodePrefix)] == guestCodePrefix {
		re.class = &guestproto.Error{Code: guestproto.Code(we.Code[len(guestCodePrefix):]), Message: we.GuestMessage}
	}
	return re
}

// Exec response frames.
const (
	frameStart  byte = 'S' // JSON startFrame
	frameStdout byte = '1' // raw bytes
	frameStderr byte = '2' // raw bytes
	frameExit   byte = 'X' // JSON guestproto.ExecResult; last
	frameError  byte = 'E' // JSON wireError; last
)

// maxFrame bounds one frame's payload.
const maxFrame = 1 << 20

func readFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("exec frame of %d bytes exceeds %d", n, maxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

func appendFrame(dst []byte, typ byte, payload []byte) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload)))
	return append(dst, payload...)
}

func jsonFrame(typ byte, v any) []byte {
	b, _ := json.Marshal(v)
	return appendFrame(nil, typ, b)
}

// demuxFrames reads the frames of an exec or attach response: it copies
// stdout and stderr frames into the pipes until the stream's last frame,
// an error frame or one of type last, whose payload decodeLast takes. It
// closes body and the pipes, with the error it returns: nil after a clean
// end, else prefixed with op (but a guest's error as sent).
func demuxFrames(c *Client, ctx context.Context, op string, body io.ReadCloser, stdout, stderr *io.PipeWriter, last byte, decodeLast func([]byte) error) error {
	defer body.Close()
	err := func() error {
		buf := make([]byte, 0, 64<<10)
		for {
			typ, payload, err := readFrame(body, buf)
			if err != nil {
				return fmt.Errorf("%s: %w", op, c.transportError(ctx, err))
			}
			buf = payload[:0]
			switch typ {
			case frameStdout:
				stdout.Write(payload)
			case frameStderr:
				stderr.Write(payload)
			case last:
				if err := decodeLast(payload); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
				return nil
			case frameError:
				var we wireError
				if err := json.Unmarshal(payload, &we); err != nil {
					return fmt.Errorf("%s: decode error: %w", op, err)
				}
				return we.err()
			default:
				return fmt.Errorf("%s: unknown frame %q", op, typ)
			}
		}
	}()
	stdout.CloseWithError(err)
	stderr.CloseWithError(err)
	return err
}

// srcReader remembers the failure (not EOF) of the reader it wraps, to tell
// a failed source from a failed destination after io.Copy, or an upload's
// source from the transport.
type srcReader struct {
	r   io.Reader
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	// io.EOF itself, not an error that wraps it: "guest connection closed:
	// read guest frame: EOF" is a failure (a download cut short), not the
	// file's end.
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// MaxLine bounds the JSON line that begins an exec request or a download,
// newline included: 4 MiB, above what any REST request within the REST
// API's 1 MiB body limit becomes (the line is encoded without HTML
// escapes, so a string grows at most twice: U+2028 to \u2028).
const MaxLine = 4 << 20

// errLineTooLong: a JSON line longer than MaxLine.
var errLineTooLong = fmt.Errorf("JSON line longer than %d bytes", MaxLine)

// encodeLine encodes v as one JSON line.
func encodeLine(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // with the newline
		return nil, err
	}
	return b.Bytes(), nil
}

// readJSONLine decodes the JSON line, of at most MaxLine bytes, that
// begins a stream. The reader's buffer may be smaller than the line.
func readJSONLine(r *bufio.Reader, v any) error {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > MaxLine {
			return errLineTooLong
		}
		line = append(line, frag...)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return json.Unmarshal(line, v)
}
