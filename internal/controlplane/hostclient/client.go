// Package hostclient is the control plane's side of the host RPC: Client
// is a remote host agent (`panda agent`) as host.Host, with its optional
// abilities (guests, processes, watches, dials to guest ports, snapshot
// packs, template builds), so that the REST API runs the same against a
// remote host as against the local one. Watch follows the agent's event
// stream. The wire format is internal/contract/hostwire's, whose package
// documentation describes the protocol; the server is
// internal/hostagent/hostapi, which this package does not import: the
// control plane reaches no host-side code.
//
// Credentials: the client trusts the agent's own CA only (ClientTLS,
// ClientTLSFromPEM, WithTLS) and sends the agent's token (hostwire.ReadToken
// reads it from the file the agent wrote).
package hostclient

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Client is a remote host agent, as host.Host. Safe for concurrent use.
//
// Short calls (Get, List, Memory, DeleteSnapshot, template lookups) are
// bounded by CallTimeout as well as by their ctx. Methods without a ctx
// answer from what the client knows: Accel and TemplateParams from the
// agent's Info (fetched by Dial, refreshed on every event stream
// connection). Errors that a local Host reports from Guest come from the
// guest operation that follows, with the same classes.
type Client struct {
	base  string
	token string
	tls   *tls.Config
	caPEM string // the agent's CA certificate, for hosts that fetch packs from it
	http  *http.Client
	log   *slog.Logger

	mu   sync.Mutex
	info hostwire.Info
}

// The client is a host (and can do what the host agent's local Host can).
var (
	_ host.Host             = (*Client)(nil)
	_ host.GuestDialer      = (*Client)(nil)
	_ host.SnapshotLister   = (*Client)(nil)
	_ host.Transferer       = (*Client)(nil)
	_ host.DirectTransferer = (*Client)(nil)
	_ host.PackCreator      = (*Client)(nil)
	_ host.PackPuller       = (*Client)(nil)
	_ host.PackSourcer      = (*Client)(nil)
	_ host.ResourceReporter = (*Client)(nil)
)

// CallTimeout bounds the short calls of host.Host (see Client).
const CallTimeout = 30 * time.Second

// Option configures a Client.
type Option func(*Client)

// WithLogger sets where the client logs what it cannot return.
func WithLogger(log *slog.Logger) Option { return func(c *Client) { c.log = log } }

// WithTLS sets the TLS configuration of an https:// agent: ClientTLS(the
// agent's CA file). Without it the system's roots are trusted.
func WithTLS(cfg *tls.Config) Option { return func(c *Client) { c.tls = cfg } }

// WithCACert records the agent's CA certificate (PEM), which the client
// hands to other host agents that fetch packs straight from this one
// (PackSource); WithTLS still says what the client itself trusts.
func WithCACert(pem string) Option { return func(c *Client) { c.caPEM = pem } }

// ErrUntrusted: the agent's certificate does not verify against the CA the
// client trusts for it (the wrong CA file, or the agent's credentials were
// rotated). Errors of this class are also host.ErrUnavailable.
var ErrUntrusted = errors.New("host agent's TLS certificate is not trusted")

// IdleConnTimeout is how long the client keeps an idle connection: less
// than the agent's HTTP idle timeout (2 minutes by default), so that the
// client, not the agent, closes idle connections and no request is sent on
// a connection the agent is closing.
const IdleConnTimeout = 60 * time.Second

// Dial returns a client of the host agent at rawURL (https://host:port)
// and checks that it answers and accepts token. It also takes http:// (no
// TLS: the token travels in clear), which panda server refuses; tests use
// it.
func Dial(rawURL, token string, opts ...Option) (*Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("host agent url %q: want https://host:port", rawURL)
	}
	c := &Client{
		base:  strings.TrimRight(u.String(), "/") + hostwire.Prefix,
		token: token,
		log:   slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(c)
	}
	c.http = &http.Client{Transport: transport(c.tls)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Resources(ctx); err != nil {
		return nil, fmt.Errorf("dial host agent %s: %w", rawURL, err)
	}
	return c, nil
}

// transport is the HTTP transport of a client trusting tlsCfg (nil: the
// system's roots).
func transport(tlsCfg *tls.Config) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext
	tr.MaxIdleConnsPerHost = 64
	tr.IdleConnTimeout = IdleConnTimeout
	tr.DisableCompression = true
	// HTTP/1.1 only, one connection per request in flight: exec streams
	// never share a connection's flow control.
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	if tlsCfg != nil {
		tr.TLSClientConfig = tlsCfg.Clone()
	}
	return tr
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

func (c *Client) setInfo(info hostwire.Info) {
	c.mu.Lock()
	c.info = info
	c.mu.Unlock()
}

// Info is what the agent last said about itself.
func (c *Client) Info() hostwire.Info {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info
}

// Resources asks the agent for its machine's resources (and refreshes
// Info).
func (c *Client) Resources(ctx context.Context) (host.Resources, error) {
	var info hostwire.Info
	if err := c.call(ctx, http.MethodGet, "/info", nil, nil, &info); err != nil {
		return host.Resources{}, err
	}
	c.setInfo(info)
	return info.Resources, nil
}

// Accel is the agent's accelerator.
func (c *Client) Accel() accel.Accel { return c.Info().Accel }

// StoredUserTemplates lists the versions of user templates whose set the
// agent's object store holds ("NAME:N").
func (c *Client) StoredUserTemplates(ctx context.Context) ([]string, error) {
	var out struct {
		Templates []string `json:"templates"`
	}
	err := c.callShort(ctx, http.MethodGet, "/user-templates/stored", nil, nil, &out)
	return out.Templates, err
}

// DropStoredUserTemplate deletes the set of version v of user template
// name from the agent's object store (none is fine), then collects the
// garbage.
func (c *Client) DropStoredUserTemplate(ctx context.Context, name string, v int) error {
	return c.call(ctx, http.MethodDelete, "/user-templates/stored/"+url.PathEscape(name)+"/"+strconv.Itoa(v), nil, nil, nil)
}

// NetworkOff implements host.NetworkReporter, from the agent's last info.
func (c *Client) NetworkOff() bool { return c.Info().NetworkOff }

var _ host.NetworkReporter = (*Client)(nil)

// TemplateParams fills in the agent's defaults, as the agent's own
// TemplateParams does.
func (c *Client) TemplateParams(name string, memoryMiB, vcpus int) templates.Params {
	p := c.Info().Defaults
	if name != "" {
		p.Name = name
	}
	if memoryMiB != 0 {
		p.MemoryMiB = memoryMiB
	}
	if vcpus != 0 {
		p.VCPUs = vcpus
	}
	return p
}

// request builds a request to path (under Prefix).
func (c *Client) request(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	return req, nil
}

// do sends req; a reply that is not 2xx becomes the agent's error.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	res, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(req.Context(), err)
	}
	if res.StatusCode/100 != 2 {
		defer res.Body.Close()
		return nil, hostwire.ReadError(res)
	}
	return res, nil
}

// transportError classifies a failure to talk to the agent: the caller's
// context ending, or the agent being unreachable (or, also, untrusted).
func (c *Client) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	ue := &host.UnreachableError{Addr: c.base, Err: err}
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) {
		return fmt.Errorf("%w: %w", ErrUntrusted, ue)
	}
	return ue
}

// call sends in (if not nil) as JSON and decodes the reply into out (if
// not nil).
func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if out == nil {
		io.Copy(io.Discard, res.Body)
		return nil
	}
	if err := json.NewDecoder(res.Body).Decode(out); err != nil {
		return c.transportError(ctx, fmt.Errorf("decode %s %s: %w", method, path, err))
	}
	return nil
}

// callShort is call bounded by CallTimeout.
func (c *Client) callShort(ctx context.Context, method, path string, q url.Values, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	return c.call(ctx, method, path, q, in, out)
}

func sandboxPath(id string, rest ...string) string {
	return "/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Create restores a new sandbox. With req.Progress it asks for the
// create's progress (fetching or baking its template first) as a stream;
// an agent that does not stream answers the sandbox alone.
func (c *Client) Create(ctx context.Context, req host.CreateRequest) (host.Info, error) {
	in := hostwire.CreateRequestOf(req)
	var info host.Info
	if req.Progress == nil {
		err := c.call(ctx, http.MethodPost, "/sandboxes", nil, in, &info)
		return info, err
	}
	b, err := json.Marshal(in)
	if err != nil {
		return info, err
	}
	hr, err := c.request(ctx, http.MethodPost, "/sandboxes", url.Values{"progress": {"1"}}, bytes.NewReader(b))
	if err != nil {
		return info, err
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := c.do(hr)
	if err != nil {
		return info, err
	}
	defer res.Body.Close()
	if !strings.HasPrefix(res.Header.Get("Content-Type"), "application/x-ndjson") {
		if err := json.NewDecoder(res.Body).Decode(&info); err != nil {
			return info, c.transportError(ctx, fmt.Errorf("decode POST /sandboxes: %w", err))
		}
		return info, nil
	}
	ev, err := c.readProgress(ctx, res.Body, "create", req.Progress)
	if err != nil {
		return info, err
	}
	if ev.Info == nil {
		return info, c.transportError(ctx, errors.New("create stream: done without the sandbox"))
	}
	return *ev.Info, nil
}

// readProgress reads a stream of ProgressEvents (a bake's, a create's with
// its progress), calls progress (if not nil) with each progress line and
// returns the done event, or the error the stream ends with.
func (c *Client) readProgress(ctx context.Context, body io.Reader, what string, progress func(string)) (hostwire.ProgressEvent, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev hostwire.ProgressEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return ev, c.transportError(ctx, fmt.Errorf("%s stream: %w", what, err))
		}
		switch ev.Type {
		case hostwire.ProgressLine:
			if progress != nil {
				progress(ev.Message)
			}
		case hostwire.ProgressDone:
			return ev, nil
		case hostwire.ProgressError:
			if ev.Error != nil {
				return ev, ev.Error.Err()
			}
		}
	}
	return hostwire.ProgressEvent{}, c.transportError(ctx, fmt.Errorf("%s stream ended without a result", what))
}

// SetNetwork changes a live sandbox's egress policy.
func (c *Client) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	return c.call(ctx, http.MethodPut, sandboxPath(id, "/network"), nil, p, nil)
}

// Kill stops a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, sandboxPath(id), nil, nil, nil)
}

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (host.Info, error) {
	var info host.Info
	err := c.callShort(ctx, http.MethodGet, sandboxPath(id), nil, nil, &info)
	return info, err
}

// List describes every sandbox of the agent, oldest first.
func (c *Client) List(ctx context.Context) ([]host.Info, error) {
	var out struct {
		Sandboxes []host.Info `json:"sandboxes"`
	}
	err := c.callShort(ctx, http.MethodGet, "/sandboxes", nil, nil, &out)
	return out.Sandboxes, err
}

// Memory reports a sandbox's memory use.
func (c *Client) Memory(ctx context.Context, id string) (host.MemStats, error) {
	var st host.MemStats
	err := c.callShort(ctx, http.MethodGet, sandboxPath(id, "/memory"), nil, nil, &st)
	return st, err
}

// Fork forks a running sandbox into children with ids.
func (c *Client) Fork(ctx context.Context, id string, childIDs []string) (host.ForkResult, error) {
	var out hostwire.ForkReply
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "/fork"), nil, hostwire.ForkRequest{IDs: childIDs}, &out); err != nil {
		return host.ForkResult{}, err
	}
	return forkResult(out), nil
}

// forkResult is a fork's reply as the contract's.
func forkResult(out hostwire.ForkReply) host.ForkResult {
	res := host.ForkResult{Capture: capture(out.Capture), Children: make([]host.ForkChild, len(out.Children))}
	for i, ch := range out.Children {
		res.Children[i].Info = ch.Info
		if ch.Error != nil {
			res.Children[i].Err = ch.Error.Err()
		}
	}
	return res
}

// Snapshot captures a running sandbox into snapshot snapshotID.
func (c *Client) Snapshot(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	var si host.SnapshotInfo
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/snapshot"), nil, hostwire.SnapshotRequest{SnapshotID: snapshotID}, &si)
	si.Capture = capture(si.Capture)
	return si, err
}

// SnapshotTransient captures a running sandbox into snapshot snapshotID,
// a transient capture (host.Transferer). An agent older than transient
// captures ignores the query and takes a durable snapshot (Transient
// false).
func (c *Client) SnapshotTransient(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	var si host.SnapshotInfo
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/snapshot"), url.Values{"transient": {"true"}}, hostwire.SnapshotRequest{SnapshotID: snapshotID}, &si)
	si.Capture = capture(si.Capture)
	return si, err
}

// AwaitStored waits, on the agent, up to wait (at most MaxStoredWait) for
// snapshot snapshotID to be durable in the object store
// (host.Transferer). An older agent answers unsupported.
func (c *Client) AwaitStored(ctx context.Context, snapshotID string, wait time.Duration) (host.SnapshotInfo, error) {
	var si host.SnapshotInfo
	q := url.Values{"wait_ms": {strconv.FormatInt(min(wait, hostwire.MaxStoredWait).Milliseconds(), 10)}}
	err := c.call(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(snapshotID)+"/stored", q, nil, &si)
	si.Capture = capture(si.Capture)
	return si, err
}

// SnapshotPack opens snapshot snapshotID as a pack (GET
// /snapshots/{id}/pack; host.DirectTransferer). An error the agent meets
// once the stream has begun ends it with that error (the X-Panda-Error
// trailer), not EOF. An older agent answers unsupported.
func (c *Client) SnapshotPack(ctx context.Context, snapshotID string) (io.ReadCloser, error) {
	return c.SnapshotPackFor(ctx, snapshotID, nil)
}

// SnapshotPackFor is SnapshotPack for a host that holds the durable
// snapshots held (the agent's HeldSnapshots): if the snapshot's sandbox
// was created from one of them, the pack is diffed against that one
// rather than the template. An older agent ignores held.
func (c *Client) SnapshotPackFor(ctx context.Context, snapshotID string, held []string) (io.ReadCloser, error) {
	var q url.Values
	if len(held) > 0 {
		q = url.Values{"held": {strings.Join(held, ",")}}
	}
	req, err := c.request(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(snapshotID)+"/pack", q, nil)
	if err != nil {
		return nil, err
	}
	res, err := c.do(req)
	if err != nil {
		return nil, err
	}
	return &fileReader{c: c, ctx: ctx, res: res, r: res.Body}, nil
}

// ReceiveSnapshot streams the pack r to the agent (POST
// /snapshots/{id}/pack; host.DirectTransferer). A failure to read r ends
// the request (the agent refuses the incomplete pack) and is returned as
// it is. An older agent answers unsupported.
func (c *Client) ReceiveSnapshot(ctx context.Context, snapshotID string, r io.Reader) (host.SnapshotInfo, error) {
	src := &hostwire.SourceReader{R: r}
	// Not a bytes.Reader or the like: always streamed (chunked).
	req, err := c.request(ctx, http.MethodPost, "/snapshots/"+url.PathEscape(snapshotID)+"/pack", nil, io.MultiReader(src))
	if err != nil {
		return host.SnapshotInfo{}, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := c.do(req)
	if err != nil {
		return host.SnapshotInfo{}, packError(snapshotID, err, src)
	}
	defer res.Body.Close()
	var si host.SnapshotInfo
	if err := json.NewDecoder(res.Body).Decode(&si); err != nil {
		return host.SnapshotInfo{}, c.transportError(ctx, fmt.Errorf("receive snapshot %s: %w", snapshotID, err))
	}
	si.Capture = capture(si.Capture)
	return si, nil
}

// ReceiveAndCreate streams the pack r to the agent and creates sandbox req
// from it (POST /snapshots/{id}/pack/create; host.PackCreator): the body
// is the create request as one JSON line, then the pack. The snapshot is
// kept if the answer says so, even with the create's error. An older
// agent answers unsupported before reading the pack.
func (c *Client) ReceiveAndCreate(ctx context.Context, req host.CreateRequest, r io.Reader) (host.Info, host.SnapshotInfo, error) {
	wire := hostwire.CreateRequestOf(req)
	wire.SnapshotID = "" // the path's
	line, err := json.Marshal(wire)
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	src := &hostwire.SourceReader{R: r}
	hr, err := c.request(ctx, http.MethodPost, "/snapshots/"+url.PathEscape(req.SnapshotID)+"/pack/create", nil,
		io.MultiReader(bytes.NewReader(append(line, '\n')), src))
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	hr.Header.Set("Content-Type", "application/octet-stream")
	res, err := c.http.Do(hr)
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, packError(req.SnapshotID, c.transportError(ctx, err), src)
	}
	return c.packCreated(ctx, res, req.SnapshotID, func(err error) error { return packError(req.SnapshotID, err, src) })
}

// packCreated is the answer res to a pack and create of snapshot id
// (…/pack/create, …/pack/pull): the sandbox and the snapshot, or the
// create's error with the snapshot kept if the answer says so, or the
// receive's error (passed through recvErr).
func (c *Client) packCreated(ctx context.Context, res *http.Response, id string, recvErr func(error) error) (host.Info, host.SnapshotInfo, error) {
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		if res.Header.Get(hostwire.HeaderSnapshotKept) == "true" {
			return host.Info{}, host.SnapshotInfo{ID: id}, hostwire.ReadError(res) // the create's
		}
		return host.Info{}, host.SnapshotInfo{}, recvErr(hostwire.ReadError(res))
	}
	var out hostwire.PackCreateResponse
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return host.Info{}, host.SnapshotInfo{}, c.transportError(ctx, fmt.Errorf("receive snapshot %s and create: %w", id, err))
	}
	out.Snapshot.Capture = capture(out.Snapshot.Capture)
	return out.Sandbox, out.Snapshot, nil
}

// PackSource says where another host agent can fetch snapshot
// snapshotID's pack from this one (host.PackSourcer): the agent's URL, its
// CA certificate (WithCACert) and a ticket for that pack, valid for ttl.
// False for an https:// agent whose CA the client does not have.
func (c *Client) PackSource(snapshotID string, ttl time.Duration) (host.PackSource, bool) {
	u := strings.TrimSuffix(c.base, hostwire.Prefix)
	if strings.HasPrefix(u, "https://") && c.caPEM == "" {
		return host.PackSource{}, false
	}
	return host.PackSource{URL: u, CACert: c.caPEM, Ticket: hostwire.PackTicket(c.token, snapshotID, time.Now().Add(ttl))}, true
}

// PullAndCreate has the agent fetch the pack of snapshot req.SnapshotID
// straight from the host agent from names, and create sandbox req from it
// as it arrives (POST /snapshots/{id}/pack/pull; host.PackPuller). The
// snapshot is kept if the answer says so, even with the create's error.
// An older agent answers unsupported.
func (c *Client) PullAndCreate(ctx context.Context, req host.CreateRequest, from host.PackSource) (host.Info, host.SnapshotInfo, error) {
	wire := hostwire.CreateRequestOf(req)
	wire.SnapshotID = "" // the path's
	b, err := json.Marshal(hostwire.PullRequest{Create: wire, From: from})
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	hr, err := c.request(ctx, http.MethodPost, "/snapshots/"+url.PathEscape(req.SnapshotID)+"/pack/pull", nil, bytes.NewReader(b))
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := c.http.Do(hr)
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, c.transportError(ctx, err)
	}
	return c.packCreated(ctx, res, req.SnapshotID, func(err error) error { return err })
}

// packError is err of a request that streamed the pack src of snapshot
// id, or the failure to read src if there was one: the agent refused an
// incomplete pack because of it. Refusals that come before the pack is
// read (an older agent, a template it lacks) stay as they are.
func packError(id string, err error, src *hostwire.SourceReader) error {
	if src.Err != nil && !errors.Is(err, errors.ErrUnsupported) && !errors.Is(err, templates.ErrNotFound) {
		return fmt.Errorf("send snapshot %s: read the pack: %w", id, src.Err)
	}
	return err
}

// Snapshots lists the snapshots the agent holds, oldest first: the server
// records one a crash left unrecorded when it reconciles.
func (c *Client) Snapshots(ctx context.Context) ([]host.SnapshotInfo, error) {
	var out struct {
		Snapshots []host.SnapshotInfo `json:"snapshots"`
	}
	err := c.call(ctx, http.MethodGet, "/snapshots", nil, nil, &out)
	for i := range out.Snapshots {
		out.Snapshots[i].Capture = capture(out.Snapshots[i].Capture)
	}
	return out.Snapshots, err
}

// DeleteSnapshot deletes a snapshot.
func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	return c.callShort(ctx, http.MethodDelete, "/snapshots/"+url.PathEscape(snapshotID), nil, nil, nil)
}

// Pause captures a running sandbox to disk and stops its VMM.
func (c *Client) Pause(ctx context.Context, id string) (host.CaptureStats, error) {
	var st host.CaptureStats
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/pause"), nil, nil, &st)
	return capture(st), err
}

// Resume restores a paused sandbox.
func (c *Client) Resume(ctx context.Context, id string) (host.Info, error) {
	var info host.Info
	err := c.call(ctx, http.MethodPost, sandboxPath(id, "/resume"), nil, nil, &info)
	return info, err
}

// Templates is the agent's template store.
func (c *Client) Templates() host.Templates { return remoteTemplates{c} }

type remoteTemplates struct{ c *Client }

func (t remoteTemplates) Lookup(ctx context.Context, p templates.Params) (*templates.Meta, string, error) {
	var out hostwire.LookupReply
	if err := t.c.callShort(ctx, http.MethodPost, "/templates/lookup", nil, p, &out); err != nil {
		return nil, "", err
	}
	return out.Template, out.StaleReason, nil
}

func (t remoteTemplates) List(ctx context.Context) ([]templates.Meta, error) {
	var out struct {
		Templates []templates.Meta `json:"templates"`
	}
	err := t.c.callShort(ctx, http.MethodGet, "/templates", nil, nil, &out)
	return out.Templates, err
}

func (t remoteTemplates) Names(ctx context.Context) ([]string, error) {
	var out struct {
		Names []string `json:"names"`
	}
	err := t.c.callShort(ctx, http.MethodGet, "/templates/names", nil, nil, &out)
	return out.Names, err
}

func (t remoteTemplates) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error) {
	b, _ := json.Marshal(p)
	req, err := t.c.request(ctx, http.MethodPost, "/templates/bake", nil, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	res, err := t.c.do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	ev, err := t.c.readProgress(ctx, res.Body, "bake", progress)
	if err != nil {
		return nil, err
	}
	return ev.Template, nil
}

// capture fills in CaptureStats.Paused, which travels as PausedMS.
func capture(st host.CaptureStats) host.CaptureStats {
	st.Paused = time.Duration(st.PausedMS * float64(time.Millisecond))
	return st
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
			typ, payload, err := hostwire.ReadFrame(body, buf)
			if err != nil {
				return fmt.Errorf("%s: %w", op, c.transportError(ctx, err))
			}
			buf = payload[:0]
			switch typ {
			case hostwire.FrameStdout:
				stdout.Write(payload)
			case hostwire.FrameStderr:
				stderr.Write(payload)
			case last:
				if err := decodeLast(payload); err != nil {
					return fmt.Errorf("%s: %w", op, err)
				}
				return nil
			case hostwire.FrameError:
				var we hostwire.Error
				if err := json.Unmarshal(payload, &we); err != nil {
					return fmt.Errorf("%s: decode error: %w", op, err)
				}
				return we.Err()
			default:
				return fmt.Errorf("%s: unknown frame %q", op, typ)
			}
		}
	}()
	stdout.CloseWithError(err)
	stderr.CloseWithError(err)
	return err
}
