// Package rest is PandaStack's REST API under /v1 (api/openapi.yaml):
// API-key authentication and per-key ownership, request decoding and
// validation, exec (buffered and streamed), files, processes, the code
// interpreter, the port proxy, templates and keys, /healthz and /metrics, and E2B's API on the
// same listener (package e2b, over e2b.go's adapter). The sandboxes'
// lifecycle and the rules about them (create with its quota, kill, TTLs
// and their expiry, network, fork, snapshots, pause/resume, templates in
// use, which templates and builds a key sees and may make, the hosts,
// reconciling with the host) are controlplane.Plane's, which the daemon
// builds and gives to New: its handlers decode, call it and encode. It
// keeps durable state in a catalog.Catalog and reaches
// sandboxes through a host.Host, the contract with a host: the host agent
// of this process (hostagent.Local, `panda up`) or a remote one
// (hostclient.Client, `panda server`). Error kinds (controlplane.Kind)
// become HTTP statuses only here (errors.go).
package rest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/recoverer"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/console"
	"github.com/pandastack/pandastack/internal/controlplane/e2b"
	"github.com/pandastack/pandastack/internal/controlplane/events"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures the API server. What the control plane decides with
// (TTLs, quotas, the user templates' registry and their bounds per key)
// is its own Config's (controlplane.Config).
type Config struct {
	// Fleet, if set, is the registry of the hosts this server places
	// sandboxes on, the Plane given to New drives them, and the host.Host
	// given to New routes each sandbox's calls to its host.
	Fleet Fleet
	// Requests that reach a sandbox's guest agent (exec, exec streams, file
	// operations) in flight at once, per sandbox and per key; more are
	// refused with 429.
	MaxGuestRequestsPerSandbox int
	MaxGuestRequestsPerKey     int
	// ExecOutputBudgetBytes bounds the output that all buffered execs in
	// flight hold in this server's memory together (each is also bounded
	// by MaxExecOutputBytes per stream). Output beyond it is dropped and
	// the exec reports truncated: /exec/stream has no such bound.
	ExecOutputBudgetBytes int64
	// MaxUploadBytes bounds one file upload.
	MaxUploadBytes int64
	// MaxExecOutputBytes bounds stdout and stderr each in buffered exec.
	MaxExecOutputBytes int

	// The port proxy (proxy.go). MaxProxyRequestsPerSandbox and
	// MaxProxyRequestsPerKey bound the proxied requests in flight (a
	// WebSocket for its whole life), apart from the guest requests above
	// (< 0: unlimited). ProxyHeaderTimeout bounds the wait for a guest's
	// answer to begin (504 after it).
	MaxProxyRequestsPerSandbox int
	MaxProxyRequestsPerKey     int
	ProxyHeaderTimeout         time.Duration
	// URLSecret signs port URLs (porturl.go; LoadOrCreateURLSecret). Empty:
	// a random one for this process, so that its URLs do not outlive it.
	URLSecret []byte
	// PublicURL is the server's base URL as clients reach it
	// (https://panda.example.com), used in signed URLs. Empty: the scheme
	// and host each request came to.
	PublicURL string
	// ProxyDomain, if set, serves sandbox ports at
	// {port}-{id}.{ProxyDomain} (proxydomain.go): a lowercase DNS name.
	ProxyDomain string

	// TemplateContextDir is where the build contexts of Dockerfile builds
	// are received, one tar file each, before the builder takes them
	// ("": the system's temporary directory). TemplateContextMaxBytes
	// bounds one (default DefaultTemplateContextMaxBytes).
	TemplateContextDir      string
	TemplateContextMaxBytes int64

	// EventPing is how often an event stream (GET /v1/events) sends a
	// ping line, so that clients notice a dead stream (default 15 s);
	// EventBuffer the events a stream may fall behind by before it is
	// ended with an overflow line (default events.DefaultBuffer).
	EventPing   time.Duration
	EventBuffer int
	// MaxEventStreamsPerKey bounds the event streams one key has open
	// at once (default DefaultMaxEventStreamsPerKey; < 0: unlimited);
	// more are refused with 429.
	MaxEventStreamsPerKey int

	// OpenAPI is the document served at /v1/openapi.yaml.
	OpenAPI []byte
	Version string
	Logger  *slog.Logger
}

// Defaults of the guest request limits (Config).
const (
	DefaultMaxGuestRequestsPerSandbox = 32
	DefaultMaxGuestRequestsPerKey     = 256
)

// SetDefaults fills in zero fields.
func (c *Config) SetDefaults() {
	if c.MaxProxyRequestsPerSandbox == 0 {
		c.MaxProxyRequestsPerSandbox = DefaultMaxProxyRequestsPerSandbox
	}
	if c.MaxProxyRequestsPerKey == 0 {
		c.MaxProxyRequestsPerKey = DefaultMaxProxyRequestsPerKey
	}
	if c.ProxyHeaderTimeout == 0 {
		c.ProxyHeaderTimeout = DefaultProxyHeaderTimeout
	}
	if c.MaxGuestRequestsPerSandbox == 0 {
		c.MaxGuestRequestsPerSandbox = DefaultMaxGuestRequestsPerSandbox
	}
	if c.MaxGuestRequestsPerKey == 0 {
		c.MaxGuestRequestsPerKey = DefaultMaxGuestRequestsPerKey
	}
	if c.ExecOutputBudgetBytes == 0 {
		c.ExecOutputBudgetBytes = 256 << 20
	}
	if c.MaxUploadBytes == 0 {
		c.MaxUploadBytes = 16 << 30
	}
	if c.MaxExecOutputBytes == 0 {
		c.MaxExecOutputBytes = 16 << 20
	}
	if c.TemplateContextMaxBytes == 0 {
		c.TemplateContextMaxBytes = DefaultTemplateContextMaxBytes
	}
	if c.EventPing == 0 {
		c.EventPing = 15 * time.Second
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = events.DefaultBuffer
	}
	if c.MaxEventStreamsPerKey == 0 {
		c.MaxEventStreamsPerKey = DefaultMaxEventStreamsPerKey
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	switch {
	case c.TemplateContextMaxBytes < 0:
		return errors.New("template context max bytes must not be negative")
	case c.EventPing < 0 || c.EventBuffer < 0:
		return errors.New("event ping interval and buffer must be positive")
	case c.ProxyHeaderTimeout < 0:
		return errors.New("proxy header timeout must be positive")
	case c.ProxyDomain != "" && !validProxyDomain(c.ProxyDomain):
		return fmt.Errorf("proxy domain %q must be a lowercase DNS name like sandboxes.example.com", c.ProxyDomain)
	case c.URLSecret != nil && len(c.URLSecret) < 16:
		return fmt.Errorf("url secret of %d bytes: want at least 16", len(c.URLSecret))
	}
	if c.PublicURL != "" {
		if _, err := parsePublicURL(c.PublicURL); err != nil {
			return err
		}
	}
	return nil
}

// parsePublicURL parses Config.PublicURL: http(s)://host[:port][/path],
// without a query or fragment.
func parsePublicURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("public url %q: want http(s)://HOST[:PORT][/PATH]", s)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// Server serves the API. Create it with New, serve Handler, run Run for
// TTL enforcement.
type Server struct {
	cfg     Config
	cat     catalog.Catalog
	host    host.Host
	log     *slog.Logger
	metrics *metrics
	handler http.Handler
	console http.Handler // the web console's files (internal/controlplane/console)

	guests  *limiter      // guest requests in flight
	streams *perKey       // event streams open
	output  *outputBudget // buffered exec output held

	proxy   *guestProxy
	proxies *limiter // proxied requests in flight
	// e2b serves E2B's API and envd on the same listener (e2b.go).
	e2b       *e2b.Server
	urlSecret []byte
	publicURL *url.URL // nil: from each request
	// publicPath is publicURL's path ("" or "/prefix"): the public path
	// prefix of every route.
	publicPath string

	buildGate buildGate // build requests being received (buildadmit.go)
	// codeGrace is how long past a cell's timeout the server waits for the
	// code interpreter's own TimeoutError (code.go).
	codeGrace time.Duration

	// cp is the control plane the handlers call: create, kill, TTLs,
	// network, fork, snapshots, pause and resume, templates in use, the
	// hosts, expiry, reconciling.
	cp *controlplane.Plane
	// events is what cp publishes record changes to, for GET /v1/events.
	events *events.Hub
}

// New returns a server of the control plane cp, whose catalog is cat and
// whose sandboxes h reaches (cp's one host, or a fleet's router). It
// closes the port proxy's connections to a sandbox whose guest cp says is
// gone, and streams what cp publishes. It starts no goroutines.
func New(cfg Config, cp *controlplane.Plane, cat catalog.Catalog, h host.Host, reg prometheus.Registerer) (*Server, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("api config: %w", err)
	}
	cfg.Logger = RedactingLogger(cfg.Logger) // no signed token or key in a log (porturl.go)
	s := &Server{cfg: cfg, cat: cat, host: h, log: cfg.Logger,
		guests:    newLimiter(cfg.MaxGuestRequestsPerSandbox, cfg.MaxGuestRequestsPerKey, "exec, streams, file operations"),
		output:    &outputBudget{max: cfg.ExecOutputBudgetBytes},
		streams:   newPerKey(cfg.MaxEventStreamsPerKey),
		proxies:   newLimiter(cfg.MaxProxyRequestsPerSandbox, cfg.MaxProxyRequestsPerKey, "proxied requests and WebSockets"),
		cp:        cp,
		events:    cp.Events(),
		codeGrace: codeTimeoutGrace,
	}
	s.urlSecret = cfg.URLSecret
	if len(s.urlSecret) == 0 {
		s.urlSecret = make([]byte, 32)
		rand.Read(s.urlSecret)
	}
	if cfg.PublicURL != "" {
		s.publicURL, _ = parsePublicURL(cfg.PublicURL) // checked by Validate
		s.publicPath = s.publicURL.Path
	}
	s.proxy = newGuestProxy(s)
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	cp.OnGone(s.proxy.closeSandbox)
	var err error
	if s.e2b, err = s.newE2B(); err != nil {
		return nil, err
	}
	m, err := newMetrics(reg, s)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.console = console.Handler()
	s.handler = s.routes()
	return s, nil
}

// Handler is the HTTP handler of the whole API.
func (s *Server) Handler() http.Handler { return s.handler }

// MetricsHandler serves the Prometheus metrics without authentication, for
// a listener of their own (the API's /metrics needs an admin key).
func (s *Server) MetricsHandler() http.Handler { return s.metrics.handler() }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	// E2B's routes come before chi's: envd requests are told apart by a
	// header, and E2B's paths are outside /v1.
	r.Use(recoverer.New(s.log, s.writeError), s.proxyDomain, s.e2b.Intercept)
	r.Get("/healthz", s.health)
	// The web console: files only, no key (it signs in with one and calls
	// this API like any other client).
	r.Get("/", s.console.ServeHTTP)
	r.Get(console.AssetPrefix+"*", s.console.ServeHTTP)
	// Signed port URLs: the token is the credential.
	r.Handle("/p/{token}", http.HandlerFunc(s.signedProxy))
	r.Handle("/p/{token}/*", http.HandlerFunc(s.signedProxy))
	// Metrics describe every tenant: admin keys only here (operators can
	// serve MetricsHandler on a separate address instead).
	r.With(s.authenticate, s.adminOnly).Get("/metrics", s.metrics.handler().ServeHTTP)
	r.Get("/v1/openapi.yaml", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(s.cfg.OpenAPI)
	})
	// Host agents joining (the join token is their credential).
	r.Post("/v1/fleet/join", s.registerHost)
	r.Post("/v1/fleet/hosts/{id}/heartbeat", s.heartbeatHost)
	r.Route("/v1", func(r chi.Router) {
		r.Use(s.authenticate)
		r.Get("/events", s.streamEvents)
		r.Post("/sandboxes", s.createSandbox)
		r.Get("/sandboxes", s.listSandboxes)
		r.Get("/sandboxes/{id}", s.getSandbox)
		r.Delete("/sandboxes/{id}", s.killSandbox)
		r.Put("/sandboxes/{id}/ttl", s.setTTL)
		r.Patch("/sandboxes/{id}/network", s.setNetwork)
		r.Post("/sandboxes/{id}/fork", s.forkSandbox)
		r.Post("/sandboxes/{id}/snapshots", s.createSnapshot)
		r.Post("/sandboxes/{id}/pause", s.pauseSandbox)
		r.Post("/sandboxes/{id}/resume", s.resumeSandbox)
		r.Get("/sandboxes/{id}/commands", s.listCommands)
		r.Get("/snapshots", s.listSnapshots)
		r.Get("/snapshots/{snapID}", s.getSnapshot)
		r.Delete("/snapshots/{snapID}", s.deleteSnapshot)
		r.Post("/volumes", s.createVolume)
		r.Get("/volumes", s.listVolumes)
		r.Get("/volumes/{name}", s.getVolume)
		r.Patch("/volumes/{name}", s.resizeVolume)
		r.Delete("/volumes/{name}", s.deleteVolume)
		r.Post("/volumes/{name}/promote", s.promoteVolume)
		r.Get("/volumes/{name}/files", s.readVolumeFile)
		r.Put("/volumes/{name}/files", s.writeVolumeFile)
		r.Delete("/volumes/{name}/files", s.removeVolumeFile)
		r.Get("/volumes/{name}/files/list", s.listVolumeFiles)
		r.Get("/volumes/{name}/files/stat", s.statVolumeFile)
		r.Post("/volumes/{name}/files/mkdir", s.mkdirVolume)
		r.Get("/hosts", s.listHosts)
		r.With(s.adminOnly).Post("/hosts/{id}/drain", s.drainHost)
		r.With(s.adminOnly).Post("/hosts/{id}/activate", s.activateHost)
		r.With(s.adminOnly).Delete("/hosts/{id}", s.forgetHost)
		// The port proxy (any method) and its signed URLs. A POST to a
		// guest path /url is the signed URL's, not the guest's.
		r.Handle("/sandboxes/{id}/ports/{port}", http.HandlerFunc(s.portProxy))
		r.Handle("/sandboxes/{id}/ports/{port}/*", http.HandlerFunc(s.portProxy))
		r.Post("/sandboxes/{id}/ports/{port}/url", s.portURL)
		r.Group(func(r chi.Router) {
			// Requests that hold a guest stream: bounded per sandbox and key.
			r.Use(s.limitGuest)
			r.Post("/sandboxes/{id}/exec", s.exec)
			r.Post("/sandboxes/{id}/exec/stream", s.execStream)
			r.Get("/sandboxes/{id}/files", s.readFile)
			r.Put("/sandboxes/{id}/files", s.writeFile)
			r.Delete("/sandboxes/{id}/files", s.removeFile)
			r.Get("/sandboxes/{id}/files/list", s.listFiles)
			r.Get("/sandboxes/{id}/files/stat", s.statFile)
			r.Post("/sandboxes/{id}/files/mkdir", s.mkdir)
			r.Post("/sandboxes/{id}/files/rename", s.rename)
			r.Get("/sandboxes/{id}/watch", s.watchDir)
			r.Get("/sandboxes/{id}/ports", s.listPorts)
			r.Post("/sandboxes/{id}/processes", s.startProcess)
			r.Get("/sandboxes/{id}/processes", s.listProcesses)
			r.Get("/sandboxes/{id}/processes/{pid}", s.getProcess)
			r.Delete("/sandboxes/{id}/processes/{pid}", s.removeProcess)
			r.Get("/sandboxes/{id}/processes/{pid}/output", s.processOutput)
			r.Post("/sandboxes/{id}/processes/{pid}/stdin", s.processStdin)
			r.Post("/sandboxes/{id}/processes/{pid}/signal", s.signalProcess)
			r.Post("/sandboxes/{id}/processes/{pid}/wait", s.waitProcess)
			r.Post("/sandboxes/{id}/processes/{pid}/resize", s.resizeProcess)
			r.Get("/sandboxes/{id}/processes/{pid}/tty", s.processTTY)
			// The code interpreter (code.go).
			r.Post("/sandboxes/{id}/code", s.runCode)
			r.Post("/sandboxes/{id}/code/interrupt", s.interruptCode)
			r.Post("/sandboxes/{id}/code/contexts", s.createCodeContext)
			r.Get("/sandboxes/{id}/code/contexts", s.listCodeContexts)
			r.Post("/sandboxes/{id}/code/contexts/{contextID}/restart", s.restartCodeContext)
			r.Delete("/sandboxes/{id}/code/contexts/{contextID}", s.removeCodeContext)
		})
		r.Get("/templates", s.listTemplates)
		r.Post("/templates/{name}/bake", s.bakeTemplate)
		r.Post("/templates", s.startBuild)
		r.Delete("/templates/{name}", s.deleteTemplate)
		r.Post("/templates/{name}/publish", s.publishTemplate(true))
		r.Post("/templates/{name}/unpublish", s.publishTemplate(false))
		r.Get("/templates/builds", s.listBuilds)
		r.Get("/templates/builds/{buildID}", s.getBuild)
		r.Get("/templates/builds/{buildID}/logs", s.buildLogs)
		r.Post("/keys", s.createKey)
		r.Get("/keys", s.listKeys)
		r.Delete("/keys/{keyID}", s.revokeKey)
		r.Post("/keys/{keyID}/purge", s.purgeKey)
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, notFound("no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(s.methodNotAllowed)
	return r
}

// methodNotAllowed is the router's answer to a method a path does not take.
func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	s.writeError(w, r, errorf(controlplane.MethodNotAllowed, "%s is not allowed on %s", r.Method, r.URL.Path))
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "version": s.cfg.Version})
}

type ctxKey struct{}

// caller is the authenticated API key of a request.
type caller struct {
	Key catalog.Key
}

// HashKey is how API key secrets are stored: hex SHA-256. Secrets are
// random (160+ bits), so a fast hash is enough: nothing to brute-force.
func HashKey(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// apiKeyPrefix begins every API key's secret (NewKey): the port proxy
// drops any header value that holds one (holdsAPIKey).
const apiKeyPrefix = "panda_"

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok && r.Header.Get("Authorization") == "" && ttyRoute(r) {
			secret, ok = wsProtocolKey(r)
		}
		c, err := s.lookUpKey(r.Context(), secret, ok, "missing API key: send Authorization: Bearer <key>")
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		ctx := context.WithValue(r.Context(), ctxKey{}, c)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// keyOf returns the API key r authenticates with (Authorization: Bearer),
// or a 401 error (missing says what to do when there is none).
func (s *Server) keyOf(r *http.Request, missing string) (*caller, error) {
	secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.lookUpKey(r.Context(), secret, ok, missing)
}

// lookUpKey returns the API key whose secret is given (ok: one was), or a
// 401 error (missing says what to do when there is none).
func (s *Server) lookUpKey(ctx context.Context, secret string, ok bool, missing string) (*caller, error) {
	if !ok || strings.TrimSpace(secret) == "" {
		return nil, errorf(controlplane.Unauthorized, "%s", missing)
	}
	key, err := s.cat.KeyByHash(ctx, HashKey(strings.TrimSpace(secret)))
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && !key.RevokedAt.IsZero()) {
		return nil, errorf(controlplane.Unauthorized, "unknown or revoked API key")
	}
	if err != nil {
		return nil, fmt.Errorf("look up api key: %w", err)
	}
	return &caller{Key: key}, nil
}

// ttyRoute reports whether r is for GET
// /v1/sandboxes/{id}/processes/{pid}/tty, the one route that takes the
// key as a WebSocket subprotocol: browsers open it (the console's
// terminal) and cannot set headers on a WebSocket. Anywhere else a
// subprotocol is not a credential, so that a key a client offers there
// is never taken for one, nor passed on (the port proxy drops it).
// The path is the one the router matches (the escaped one if it differs).
func ttyRoute(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	p := r.URL.RawPath
	if p == "" {
		p = r.URL.Path
	}
	rest, ok := strings.CutPrefix(p, "/v1/sandboxes/")
	if !ok {
		return false
	}
	seg := strings.Split(rest, "/")
	return len(seg) == 4 && seg[0] != "" && seg[1] == "processes" && seg[2] != "" && seg[3] == "tty"
}

// wsProtocolKey returns the API key a WebSocket handshake offers as the
// subprotocol "bearer.<key>", for browsers, which cannot set headers on
// a WebSocket (see processTTY; only there: ttyRoute).
func wsProtocolKey(r *http.Request) (string, bool) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return "", false
	}
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(h, ",") {
			if key, ok := strings.CutPrefix(strings.TrimSpace(p), wsBearerPrefix); ok {
				return key, true
			}
		}
	}
	return "", false
}

func callerOf(r *http.Request) *caller {
	c, _ := r.Context().Value(ctxKey{}).(*caller)
	return c
}

// adminOnly lets only admin keys through.
func (s *Server) adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := requireAdmin(r); err != nil {
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func requireAdmin(r *http.Request) error {
	if c := callerOf(r); c == nil || !c.Key.Admin {
		return errorf(controlplane.Forbidden, "this needs an admin API key")
	}
	return nil
}

// Shutdown ends the event streams (CloseStreams) and closes the port
// proxy's connections to guests, which ends the WebSockets the HTTP
// server's own shutdown does not wait for. Requests must have stopped
// first; the control plane's operations in flight are its own
// (controlplane.Plane.Shutdown).
func (s *Server) Shutdown() {
	s.CloseStreams()
	s.proxy.close()
}
