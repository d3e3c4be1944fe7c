package restfuzz

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
	"github.com/prometheus/client_golang/prometheus"
)

// The world FuzzAPI's requests meet: a real router and SQLite catalog over
// the in-memory hosttest host (wrapped to give its sandboxes guests and
// ports), with an admin key, a user key and three sandboxes of fixed ids
// (so that committed inputs name them): the user's running sandboxUser and
// paused sandboxPaused, and the admin's running sandboxAdmin. After each
// request the world is put back as it was (heal): the requests kill,
// pause, resume, fork and create.
const (
	sandboxUser   = "fuzzuser000000000001"
	sandboxPaused = "fuzzuser000000000002"
	sandboxAdmin  = "fuzzadmin00000000001"
	proxyDomain   = "sb.test"
	hostID        = "local"
)

// urlSecret is fixed, so that envd access tokens (derived from it) are
// the same in every run.
var urlSecret = []byte("apifuzz url secret, 32 bytes ...")

type world struct {
	srv      *httptest.Server
	cat      catalog.Catalog
	host     *fuzzHost
	log      *syncBuffer
	quiet    *slog.Logger // for servers other than srv
	admin    string       // API key secrets
	user     string
	adminKey catalog.Key
	userKey  catalog.Key
	// envd access tokens and signed port tokens (port 8000) of the
	// sandboxes, made through the API as clients get them.
	envd  map[string]string
	ports map[string]string
	// initial records, which heal restores.
	records map[string]catalog.Sandbox
	// contexts is where build contexts are received
	// (Config.TemplateContextDir).
	contexts string
}

// owner is the key secret that owns sandbox id.
func (w *world) owner(id string) string {
	if id == sandboxAdmin {
		return w.admin
	}
	return w.user
}

func newWorld(f *testing.F) *world {
	ctx := context.Background()
	cat, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "panda.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cat.Close() })
	w := &world{cat: cat, log: &syncBuffer{}, quiet: slog.New(slog.DiscardHandler), envd: map[string]string{}, ports: map[string]string{},
		host: &fuzzHost{Host: hosttest.New()}}
	w.contexts = filepath.Join(f.TempDir(), "contexts")
	log := slog.New(slog.NewTextHandler(w.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := prometheus.NewRegistry()
	cp, err := controlplane.New(controlplane.Config{HostID: hostID, Templates: &fuzzBuilds{}, Logger: rest.RedactingLogger(log)}, cat, w.host, reg)
	if err != nil {
		f.Fatal(err)
	}
	srv, err := rest.New(rest.Config{
		MaxUploadBytes: 1 << 20, OpenAPI: []byte("openapi: 3.0.3\n"),
		URLSecret: urlSecret, ProxyDomain: proxyDomain,
		TemplateContextDir: w.contexts, TemplateContextMaxBytes: 1 << 20,
		Logger: log,
	}, cp, cat, w.host, reg)
	if err != nil {
		f.Fatal(err)
	}
	w.srv = httptest.NewUnstartedServer(srv.Handler())
	w.srv.Config.ErrorLog = nil
	w.srv.Start()
	f.Cleanup(w.srv.Close)
	if w.adminKey, w.admin, err = rest.NewKey(ctx, cat, "admin", true, 0, 0); err != nil {
		f.Fatal(err)
	}
	if w.userKey, w.user, err = rest.NewKey(ctx, cat, "user", false, 8, 8*512); err != nil {
		f.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	w.records = map[string]catalog.Sandbox{}
	for _, s := range []struct {
		id, key string
		state   lifecycle.State
	}{{sandboxUser, w.userKey.ID, lifecycle.Running}, {sandboxPaused, w.userKey.ID, lifecycle.Paused}, {sandboxAdmin, w.adminKey.ID, lifecycle.Running}} {
		sb := catalog.Sandbox{ID: s.id, KeyID: s.key, Template: "base", HostID: hostID, State: string(s.state),
			MemoryMiB: 512, VCPUs: 1, DiskMiB: 1024, Network: catalog.Network{Internet: true, AllowOut: []string{}, DenyOut: []string{}},
			Metadata: map[string]string{"app": "fuzz"}, Env: map[string]string{}, TTLSeconds: 3600, OnExpire: "kill",
			CreatedAt: now, ExpiresAt: now.Add(24 * time.Hour)}
		if err := cat.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
			f.Fatal(err)
		}
		if sb, err = cat.GetSandbox(ctx, s.id); err != nil {
			f.Fatal(err)
		}
		w.records[s.id] = sb
		w.host.Put(hostInfo(sb))
	}
	// What clients get from the API: envd access tokens (E2B's connect)
	// and signed port URLs.
	for _, id := range []string{sandboxUser, sandboxAdmin} {
		var sbx struct {
			Token string `json:"envdAccessToken"`
		}
		w.setup(f, "POST", "/sandboxes/"+id+"/connect", map[string]string{"X-API-KEY": w.owner(id)}, "{}", &sbx)
		w.envd[id] = sbx.Token
		var pu struct{ URL string }
		w.setup(f, "POST", "/v1/sandboxes/"+id+"/ports/8000/url", map[string]string{"Authorization": "Bearer " + w.owner(id)}, "{}", &pu)
		u, err := url.Parse(pu.URL)
		if err != nil || u.Query().Get("panda_token") == "" {
			f.Fatalf("signed URL %q of sandbox %s: no panda_token (%v)", pu.URL, id, err)
		}
		w.ports[id] = u.Query().Get("panda_token")
	}
	return w
}

// setup sends a request the world's setup needs, and decodes its answer.
func (w *world) setup(f *testing.F, method, target string, headers map[string]string, body string, out any) {
	req, err := http.NewRequest(method, w.srv.URL+target, strings.NewReader(body))
	if err != nil {
		f.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode >= 300 {
		f.Fatalf("setup %s %s: %d %s; server log:\n%s", method, target, res.StatusCode, b, w.log.String())
	}
	if err := json.Unmarshal(b, out); err != nil {
		f.Fatalf("setup %s %s: %v in %s", method, target, err, b)
	}
}

func hostInfo(sb catalog.Sandbox) host.Info {
	return host.Info{ID: sb.ID, Template: sb.Template, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
		State: lifecycle.State(sb.State), CreatedAt: sb.CreatedAt, Hostname: "sandbox-" + sb.ID}
}

// heal puts the world back as newWorld made it: the three sandboxes in
// their states, on the host and in the catalog, and no others.
func (w *world) heal(t *testing.T) {
	ctx := context.Background()
	for id, want := range w.records {
		sb, err := w.cat.GetSandbox(ctx, id)
		switch {
		case errors.Is(err, catalog.ErrNotFound):
			if err := w.cat.ReserveSandbox(ctx, want, catalog.Limits{Sandboxes: -1, MemoryMiB: -1, VCPUs: -1, DiskMiB: -1}); err != nil {
				t.Fatalf("heal: %v", err)
			}
		case err != nil:
			t.Fatalf("heal: %v", err)
		case sb.State != want.State || !sb.ExpiresAt.Equal(want.ExpiresAt) || sb.KeyID != want.KeyID || sb.LastError != "" || sb.PausedBytes != 0:
			if _, err := w.cat.UpdateSandbox(ctx, id, func(s *catalog.Sandbox) error { *s = want; return nil }); err != nil {
				t.Fatalf("heal: %v", err)
			}
		}
		if info, ok := w.host.Sandbox(id); !ok || info.State != lifecycle.State(want.State) {
			w.host.Put(hostInfo(want))
		}
	}
	all, err := w.cat.ListSandboxes(ctx, catalog.SandboxFilter{})
	if err != nil {
		t.Fatalf("heal: %v", err)
	}
	for _, sb := range all {
		if _, ok := w.records[sb.ID]; !ok {
			w.cat.DeleteSandbox(ctx, sb.ID)
			w.host.Lose(sb.ID)
		}
	}
	for _, info := range w.host.list() {
		if _, ok := w.records[info.ID]; !ok {
			w.host.Lose(info.ID)
		}
	}
}

// fuzzBuilds is a template builder that knows no templates and takes
// every build it is given (removing its context, as the real one does
// once done). Embedding the interface keeps it compiling when Builder
// grows; a handler calling a new method then panics (500), and the seeds
// say which to add.
type fuzzBuilds struct {
	builds.Builder
	mu sync.Mutex
	n  int
}

func (b *fuzzBuilds) Start(ctx context.Context, spec builds.Spec) (builds.Status, error) {
	if spec.ContextTar != "" {
		os.Remove(spec.ContextTar)
	}
	b.mu.Lock()
	b.n++
	id := fmt.Sprintf("build%d", b.n)
	b.mu.Unlock()
	return builds.Status{ID: id, Name: spec.Name, Source: spec.FromImage, State: builds.StateQueued, CreatedAt: time.Now().UTC(), Owner: spec.Owner}, nil
}

func (b *fuzzBuilds) Get(ctx context.Context, id string) (builds.Status, error) {
	return builds.Status{}, fmt.Errorf("build %s: %w", id, builds.ErrNotFound)
}

func (b *fuzzBuilds) List(ctx context.Context) ([]builds.Status, error) { return nil, nil }

func (b *fuzzBuilds) Follow(ctx context.Context, id string, line func(string)) (builds.Status, error) {
	return b.Get(ctx, id)
}

func (b *fuzzBuilds) Remove(ctx context.Context, ref string) error {
	return fmt.Errorf("template %s: %w", ref, templates.ErrNotFound)
}

func (b *fuzzBuilds) SetPublic(ctx context.Context, name string, public bool) error {
	return fmt.Errorf("template %s: %w", name, templates.ErrNotFound)
}

func (b *fuzzBuilds) UserTemplate(ctx context.Context, ref string) (templates.UserRootFS, error) {
	return templates.UserRootFS{}, fmt.Errorf("template %s: %w", ref, templates.ErrNotFound)
}

func (b *fuzzBuilds) UserTemplates(ctx context.Context) ([]templates.UserRootFS, error) {
	return nil, nil
}

func (b *fuzzBuilds) Versions(ctx context.Context, name string) ([]templates.UserRootFS, error) {
	return nil, nil
}

// reach is one time a request reached a sandbox: its guest agent (Guest)
// or a port of its guest (DialGuest).
type reach struct {
	id   string
	port int // 0: the guest agent
}

// fuzzHost is the hosttest host with guests: Guest answers with a fake
// guest agent, DialGuest with a fake web server on every port. It records
// every id the API hands it, and what reached which guest.
type fuzzHost struct {
	*hosttest.Host

	mu      sync.Mutex
	ids     []string         // every sandbox or snapshot id the host was handed
	reached []reach          // guests and ports reached
	proxied []proxiedToGuest // requests the guests' web servers got
}

// proxiedToGuest is a request as a guest's web server got it.
type proxiedToGuest struct {
	id     string
	port   int
	req    *http.Request
	header http.Header
}

// begin forgets what the last request did.
func (h *fuzzHost) begin() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids, h.reached, h.proxied = h.ids[:0], h.reached[:0], h.proxied[:0]
}

func (h *fuzzHost) saw(ids ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ids = append(h.ids, ids...)
}

func (h *fuzzHost) list() []host.Info {
	l, _ := h.Host.List(context.Background())
	return l
}

func (h *fuzzHost) Create(ctx context.Context, req host.CreateRequest) (host.Info, error) {
	h.saw(req.ID)
	if req.SnapshotID != "" {
		h.saw(req.SnapshotID)
	}
	return h.Host.Create(ctx, req)
}

func (h *fuzzHost) Kill(ctx context.Context, id string) error {
	h.saw(id)
	return h.Host.Kill(ctx, id)
}

func (h *fuzzHost) Get(ctx context.Context, id string) (host.Info, error) {
	h.saw(id)
	return h.Host.Get(ctx, id)
}

func (h *fuzzHost) Memory(ctx context.Context, id string) (host.MemStats, error) {
	h.saw(id)
	return h.Host.Memory(ctx, id)
}

func (h *fuzzHost) Fork(ctx context.Context, id string, childIDs []string) (host.ForkResult, error) {
	h.saw(append([]string{id}, childIDs...)...)
	return h.Host.Fork(ctx, id, childIDs)
}

func (h *fuzzHost) Snapshot(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	h.saw(id, snapshotID)
	return h.Host.Snapshot(ctx, id, snapshotID)
}

func (h *fuzzHost) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	h.saw(snapshotID)
	return h.Host.DeleteSnapshot(ctx, snapshotID)
}

func (h *fuzzHost) Pause(ctx context.Context, id string) (host.CaptureStats, error) {
	h.saw(id)
	return h.Host.Pause(ctx, id)
}

func (h *fuzzHost) Resume(ctx context.Context, id string) (host.Info, error) {
	h.saw(id)
	return h.Host.Resume(ctx, id)
}

func (h *fuzzHost) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	h.saw(id)
	return h.Host.SetNetwork(ctx, id, p)
}

// running is sandbox id if the host has it running.
func (h *fuzzHost) running(id string) error {
	info, ok := h.Host.Sandbox(id)
	if !ok {
		return fmt.Errorf("sandbox %s: %w", id, host.ErrNotFound)
	}
	if info.State != lifecycle.Running {
		return fmt.Errorf("sandbox %s is %s: %w", id, info.State, host.ErrConflict)
	}
	return nil
}

func (h *fuzzHost) Guest(ctx context.Context, id string) (host.Guest, error) {
	h.saw(id)
	if err := h.running(id); err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.reached = append(h.reached, reach{id: id})
	h.mu.Unlock()
	return &fuzzGuest{}, nil
}

var _ host.GuestDialer = (*fuzzHost)(nil)

// DialGuest connects to a fake web server that records the request and
// answers 200 "ok" (and closes).
func (h *fuzzHost) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	h.saw(id)
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("port %d: %w", port, host.ErrInvalid)
	}
	if err := h.running(id); err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.reached = append(h.reached, reach{id: id, port: port})
	h.mu.Unlock()
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		req, err := http.ReadRequest(bufio.NewReader(server))
		if err != nil {
			return
		}
		io.Copy(io.Discard, io.LimitReader(req.Body, 1<<20))
		h.mu.Lock()
		h.proxied = append(h.proxied, proxiedToGuest{id: id, port: port, req: req, header: req.Header.Clone()})
		h.mu.Unlock()
		server.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
	}()
	return client, nil
}

// fuzzGuest is a guest agent with a small fixed file tree (directories
// /, /work and anything named d; a name "missing" is not there), commands
// that print "out" and exit 0, one background process (pid 7, exited by
// the time one attaches), and watches that end at once.
type fuzzGuest struct{}

var (
	_ host.ProcessGuest = (*fuzzGuest)(nil)
	_ host.DirWatcher   = (*fuzzGuest)(nil)
)

func (g *fuzzGuest) info(p string) (guestproto.FileInfo, error) {
	if strings.HasSuffix(p, "/missing") {
		return guestproto.FileInfo{}, guestproto.Errorf(guestproto.CodeNotFound, "%s: no such file or directory", p)
	}
	dir := p == "/" || p == "/work" || strings.HasSuffix(p, "/d")
	return guestproto.FileInfo{Name: p[strings.LastIndex(p, "/")+1:], Path: p, Size: 5, Mode: 0o644, IsDir: dir, MtimeUnixNano: 1}, nil
}

func (g *fuzzGuest) StartExec(ctx context.Context, req guestproto.ExecRequest) (host.Process, error) {
	if err := req.Validate(); err != nil {
		return nil, guestproto.Errorf(guestproto.CodeInvalid, "%v", err)
	}
	return &fuzzProcess{}, nil
}

func (g *fuzzGuest) ReadFile(ctx context.Context, p string) (io.ReadCloser, guestproto.FileInfo, error) {
	fi, err := g.info(p)
	if err != nil {
		return nil, fi, err
	}
	if fi.IsDir {
		return nil, fi, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", p)
	}
	return io.NopCloser(strings.NewReader("hello")), fi, nil
}

func (g *fuzzGuest) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) (int64, error) {
	return io.Copy(io.Discard, io.LimitReader(r, 2<<20))
}

func (g *fuzzGuest) ListDir(ctx context.Context, p string) ([]guestproto.FileInfo, error) {
	return []guestproto.FileInfo{{Name: "a.txt", Size: 1, Mode: 0o644}, {Name: "d", IsDir: true, Mode: 0o755}}, nil
}

func (g *fuzzGuest) Stat(ctx context.Context, p string) (guestproto.FileInfo, error) {
	return g.info(p)
}
func (g *fuzzGuest) Mkdir(ctx context.Context, p string) error                  { return nil }
func (g *fuzzGuest) Remove(ctx context.Context, p string, recursive bool) error { return nil }
func (g *fuzzGuest) Rename(ctx context.Context, oldpath, newpath string) error  { return nil }

func (g *fuzzGuest) proc(pid int) (guestproto.ProcInfo, error) {
	if pid != 7 {
		return guestproto.ProcInfo{}, guestproto.Errorf(guestproto.CodeNotFound, "no process %d", pid)
	}
	return guestproto.ProcInfo{PID: 7, Cmd: "sh", State: guestproto.ProcRunning, StdinOpen: true}, nil
}

func (g *fuzzGuest) StartProcess(ctx context.Context, req guestproto.ExecRequest) (guestproto.ProcInfo, error) {
	if err := req.Validate(); err != nil {
		return guestproto.ProcInfo{}, guestproto.Errorf(guestproto.CodeInvalid, "%v", err)
	}
	return g.proc(7)
}

func (g *fuzzGuest) ListProcesses(ctx context.Context) ([]guestproto.ProcInfo, error) {
	p, _ := g.proc(7)
	return []guestproto.ProcInfo{p}, nil
}

func (g *fuzzGuest) AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error) {
	p, err := g.proc(pid)
	if err != nil {
		return nil, err
	}
	exited := p
	exited.State, exited.Exit, exited.StdinOpen = guestproto.ProcExited, &guestproto.ExecResult{ExitCode: 0}, false
	return guestproto.NewAttachment(guestproto.AttachStart{}, p, strings.NewReader("out"), strings.NewReader(""),
		func() (guestproto.ProcInfo, bool, error) { return exited, false, nil }, func() {}), nil
}

func (g *fuzzGuest) WriteProcessStdin(ctx context.Context, pid int, p []byte) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzGuest) CloseProcessStdin(ctx context.Context, pid int) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzGuest) SignalProcess(ctx context.Context, pid int, signal string) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzGuest) WaitProcess(ctx context.Context, pid int) (guestproto.ProcInfo, error) {
	p, err := g.proc(pid)
	p.State, p.Exit = guestproto.ProcExited, &guestproto.ExecResult{}
	return p, err
}

func (g *fuzzGuest) RemoveProcess(ctx context.Context, pid int) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzGuest) ResizeProcess(ctx context.Context, pid, rows, cols int) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzGuest) WatchDir(ctx context.Context, p string, recursive bool) (*guestproto.DirWatch, error) {
	sent := false
	return guestproto.NewDirWatch(func() (guestproto.WatchEvent, error) {
		if !sent {
			sent = true
			return guestproto.WatchEvent{Type: "create", Path: strings.TrimSuffix(p, "/") + "/new"}, nil
		}
		return guestproto.WatchEvent{}, io.EOF
	}, func() error { return nil }), nil
}

// fuzzProcess is a command that printed "out" and exited 0.
type fuzzProcess struct{}

func (p *fuzzProcess) PID() int              { return 7 }
func (p *fuzzProcess) Stdin() io.WriteCloser { return nopWriteCloser{} }
func (p *fuzzProcess) Stdout() io.Reader     { return strings.NewReader("out\n") }
func (p *fuzzProcess) Stderr() io.Reader     { return bytes.NewReader(nil) }
func (p *fuzzProcess) Wait() (guestproto.ExecResult, error) {
	return guestproto.ExecResult{ExitCode: 0, DurationMS: 1}, nil
}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }

// syncBuffer collects the server's log for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 1<<20 {
		s.b.Reset()
	}
	return s.b.Write(p)
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
