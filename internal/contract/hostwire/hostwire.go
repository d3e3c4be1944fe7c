// Package hostwire is the wire format of the host RPC, the internal
// HTTP/JSON API between the control plane (`panda server`) and a host agent
// (`panda agent`): what both sides must agree on, byte for byte, since
// agents and servers of adjacent versions talk to each other. The server is
// internal/hostagent/hostapi (one agent under /host/v1), the client
// internal/controlplane/hostclient (host.Host over it, so that the REST API
// runs the same against a remote host as against the local one). Like every
// contract package it imports the standard library and the contract only.
//
// Transport and credentials: the agent serves the API over TLS 1.3
// (HTTP/1.1) with a certificate signed by a CA of its own, made on first
// start; the control plane trusts that CA only, for that agent, and sends
// the agent's own token (ReadToken): every request but GET /healthz carries
// `Authorization: Bearer <agent token>`, compared in constant time. Each
// agent has its own CA, certificate and token. Another host agent may fetch
// one snapshot's pack with a ticket instead (`Authorization: Ticket …`,
// PackTicket).
//
// Errors travel as {"error": {"code", "message"}} (ErrorBody); the code
// names the error (a sentinel the control plane tells apart, a guest's
// *guestproto.Error, a timeout) or its class (internal/contract/errs:
// errors.go), and the client rebuilds an error of that same name or class
// with the same text (Error.Err), so the API's error classification does
// not know whether the host is remote.
//
// Streams:
//   - exec (POST …/exec) is full duplex over one HTTP request: the request
//     body is one JSON line (the guestproto.ExecRequest, of any length up to
//     MaxLine) followed by the raw bytes of stdin; the response is a
//     sequence of frames (a type byte, a big-endian uint32 length, the
//     payload: AppendFrame, ReadFrame): start {"pid"}, stdout and stderr
//     bytes, then exit (guestproto.ExecResult) or error. The server
//     enables full duplex (http.ResponseController.EnableFullDuplex) so
//     that it reads stdin while it writes output; Go's client sends a
//     streamed request body concurrently with reading the response and
//     flushes every chunk. The same handler works unchanged over HTTP/2.
//     Closing the connection (the client's context ending) kills the
//     process, as cancelling guestproto's StartExec does.
//   - read file (GET …/files) answers one JSON line (the guestproto.FileInfo,
//     at most MaxLine) and the file's bytes; an error after the first byte
//     arrives in the X-Panda-Error trailer (HeaderError), so a failed
//     download is never a short file.
//   - write file (PUT …/files) streams the request body into the guest.
//   - snapshot packs (host.DirectTransferer; the format is
//     chunkstore's): GET …/snapshots/{id}/pack answers the pack of a
//     snapshot the agent holds as the body, an error after the first
//     byte in the X-Panda-Error trailer (and the pack lacks its trailer
//     record, so a receiver refuses it anyway); ?held=<id>,… names the
//     durable snapshots the requester holds, one of which the pack may
//     be diffed against (the agent's SendSnapshot); POST …/snapshots/{id}/pack
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
//     POST …/snapshots/{id}/pack/pull (host.PackPuller) has the agent
//     fetch that pack itself from another agent (PullRequest: where, and
//     a ticket) and answers as …/pack/create does.
//   - template bake and the event stream (GET /host/v1/events) are NDJSON;
//     so is a create (POST /host/v1/sandboxes) with ?progress=1: its
//     progress lines, then done with the sandbox's Info, or error
//     (ProgressEvent).
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
//     "error":{…}} (WatchLine).
//   - attach, wait and watch last as long as the process or the client:
//     no body that may idle, no write timeout; like event streams and
//     dials they are not requests in flight for the server's Shutdown,
//     and its Close ends them.
//   - dial (GET …/sandboxes/{id}/dial?port=N, with Connection: Upgrade and
//     Upgrade: panda-tcp) opens a TCP connection to port N of the guest
//     (the agent's DialGuest: over the sandbox's network, or through its
//     guest agent on a host without sandbox networking) and answers 101
//     Switching Protocols; from then on the connection, still inside its
//     TLS session, carries that TCP connection's bytes both ways,
//     unframed, until either side closes. A side that finishes sending
//     half-closes (TLS close_notify towards the client, FIN or the agent
//     channel's CLOSE towards the guest) and can still read the other's
//     answer. A dial that fails is an ordinary error answer: not_found,
//     conflict (the sandbox is not running), invalid (port), refused
//     (nothing listens on the port), timeout, unsupported (the host has no
//     sandbox networking and the sandbox's guest agent is too old to carry
//     connections), guest.busy (too many connections carried by the
//     sandbox's guest agent). The client makes a new connection
//     to the agent per dial, never reused: the control plane's port proxy
//     pools the connections it gets. Dials are not requests in flight for
//     the server's Shutdown; its Close ends them.
//
// The event stream tells the control plane what it cannot ask for: a sandbox
// whose VMM died (the agent's OnExit) or that the agent stopped as it shut
// down. Its first event is hello (the host's accelerator and template
// defaults), then exit events, and a ping every PingInterval. A client
// reconnects when the stream breaks and reconciles with List on every
// (re)connect, since events sent while it was away are lost.
package hostwire

import (
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
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

// UpgradeProtocol is the Upgrade token of a dial (GET …/dial?port=N): after
// the agent's 101 Switching Protocols the connection carries the bytes of
// a TCP connection to that port of the guest, both ways.
const UpgradeProtocol = "panda-tcp"

// Headers of answers.
const (
	// HeaderError is the trailer of a download or a pack whose stream
	// failed after its first byte: an Error as JSON (TrailerError).
	HeaderError = "X-Panda-Error"
	// HeaderSnapshotKept, "true" on an error answer of POST
	// …/snapshots/{id}/pack/create or …/pack/pull, says the pack was
	// received and kept as the snapshot: only the create failed.
	HeaderSnapshotKept = "X-Panda-Snapshot-Kept"
)

// ErrUnauthorized: the agent rejected the token (or a ticket).
var ErrUnauthorized = errs.New(errs.Unauthorized, "host agent rejected the token")

// Info describes a host agent: what host.Host's Accel and TemplateParams
// answer. GET /info answers it; it is also the hello event's.
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
	Type string `json:"type"` // EventHello, EventExit or EventPing
	Info *Info  `json:"info,omitempty"`
	// ID, Reason and Error describe an exit: Reason is ReasonExited or
	// ReasonShutdown.
	ID     string `json:"id,omitempty"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Types of events.
const (
	EventHello = "hello" // first, with the agent's Info
	EventExit  = "exit"  // a sandbox stopped without being killed through the API
	EventPing  = "ping"  // every PingInterval
)

// Reasons of an exit event.
const (
	// ReasonExited: the VMM died by itself.
	ReasonExited = "vmm_exited"
	// ReasonShutdown: the agent stopped the sandbox as it shut down
	// (host.ErrHostShutdown).
	ReasonShutdown = "host_shutdown"
)
