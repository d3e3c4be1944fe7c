package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
)

// AgentDefaults returns the configuration `panda agent` runs with when
// nothing is set: Defaults, listening on the host API's port.
func AgentDefaults() Config {
	c := Defaults()
	c.Listen = "127.0.0.1:7789"
	return c
}

// ServerDefaults returns the configuration `panda server` runs with when
// nothing is set: Defaults, with the host agent on this host.
func ServerDefaults() Config {
	c := Defaults()
	c.AgentURL = "https://127.0.0.1:7789"
	return c
}

// AgentTokenFile is the agent token's file: cfg.AgentTokenFile, or
// DATA_DIR/agent.token.
func AgentTokenFile(cfg Config) string {
	if cfg.AgentTokenFile != "" {
		return cfg.AgentTokenFile
	}
	return filepath.Join(cfg.DataDir, hostapi.TokenFile)
}

// AgentEndpoint is how `panda server` reaches one host agent: its URL and
// that agent's own credentials.
type AgentEndpoint struct {
	URL       string // https://host:port
	TokenFile string // the agent's token
	CAFile    string // the agent's CA certificate: the only one trusted for it
}

// Agents are the host agents `panda server` drives, each with its own
// credentials. Today there is one, from agent_url, agent_token_file and
// agent_ca_file (defaults in DATA_DIR, as `panda agent` writes them when
// the two share it); a list of agents would come as more endpoints, with
// those keys staying the first.
func (c *Config) Agents() []AgentEndpoint {
	ca := c.AgentCAFile
	if ca == "" {
		ca = filepath.Join(c.DataDir, hostapi.CAFile)
	}
	return []AgentEndpoint{{URL: c.AgentURL, TokenFile: AgentTokenFile(*c), CAFile: ca}}
}

// check reports an endpoint panda server must not use: the host API's
// token and commands never travel in clear, so the URL is https://.
func (e AgentEndpoint) check() error {
	u, err := url.Parse(e.URL)
	switch {
	case e.URL == "":
		return errors.New("agent_url is required (the host agent's API, e.g. https://127.0.0.1:7789)")
	case err != nil || u.Host == "":
		return fmt.Errorf("agent_url %q: want https://HOST:PORT", e.URL)
	case u.Scheme == "http":
		return fmt.Errorf("agent_url %q: the host API is served over TLS only: use https://%s (trusting the agent's CA, agent_ca_file)", e.URL, u.Host)
	case u.Scheme != "https":
		return fmt.Errorf("agent_url %q: want https://HOST:PORT", e.URL)
	}
	return nil
}

// agentCertHosts are the names and addresses of the agent's certificate:
// localhost, this host's name, the listen address or, when it is all
// addresses, every address of this host, and extra.
func agentCertHosts(listen string, extra []string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if name, err := os.Hostname(); err == nil && isDNSName(name) {
		hosts = append(hosts, name)
	}
	host, _, _ := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
				hosts = append(hosts, n.IP.String())
			}
		}
	} else {
		hosts = append(hosts, host)
	}
	hosts = append(hosts, extra...)
	var out []string
	seen := map[string]bool{}
	for _, h := range hosts {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

// isDNSName reports whether s can be a certificate's DNS name.
func isDNSName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return s != ""
}

// RunAgent runs a host agent and its host API (`panda agent`) until ctx
// ends. It adopts the VMMs an earlier run left running, as Run does; the
// control plane that connects reconciles its catalog with them. On first
// start it writes a random agent token to AgentTokenFile (mode 0600) and
// its TLS credentials to the data directory (hostapi.LoadOrCreateTLS).
// Shutdown: no new requests, those in flight get 10 s, then (OnShutdown
// kill) running sandboxes are killed and connected servers told so, then
// the event streams end and the store is closed.
func RunAgent(ctx context.Context, cfg Config, out io.Writer, log *slog.Logger) error {
	ln, release, err := prepare(cfg, lockHost)
	if err != nil {
		return err
	}
	defer release()
	tokenFile := AgentTokenFile(cfg)
	token, created, err := hostapi.LoadOrCreateToken(tokenFile)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "Created the agent token in %s (mode 0600): give it to panda server with --agent-token-file.\n", tokenFile)
	}
	creds, err := hostapi.LoadOrCreateTLS(cfg.DataDir, agentCertHosts(cfg.Listen, cfg.TLSHosts))
	if err != nil {
		return fmt.Errorf("cannot set up the host API's TLS: %w", err)
	}
	if creds.CreatedCA {
		fmt.Fprintf(out, "Created the agent's CA in %s: give it to panda server with --agent-ca-file.\n", creds.CAFile)
	}
	if creds.Issued {
		log.Info("issued the host api certificate", "hosts", strings.Join(creds.Hosts, ","), "not_after", creds.NotAfter().Format(time.RFC3339))
	}

	jc, err := prepareJoin(cfg, ln.Addr(), token, creds.CAFile)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	ag, nw, exits, err := openHost(ctx, cfg, log)
	if err != nil {
		return err
	}
	keepRunning := true // until it serves: see Run
	defer func() { closeHost(ag, nw, keepRunning, log) }()
	hsrv := hostapi.NewServer(ag, token, log.With("part", "hostapi"))
	defer hsrv.Close()
	exits.set(hsrv.SandboxExited)
	// Template builds, for the control plane whose one host this agent is
	// (panda server --agent): closed before the host (deferred after it),
	// cancelling the builds in flight.
	builds, err := openTemplateBuilds(cfg, ag, log)
	if err != nil {
		return err
	}
	defer builds.Close()
	hsrv.ServeBuilds(builds, cfg.templateContextDir())
	if cfg.ServerURL != "" {
		// A host of a fleet: its user templates are copies of what the
		// fleet's registry lists; those deleted while it was away go.
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := ag.SweepUserCopies(sctx)
		cancel()
		if err != nil {
			log.Warn("cannot check this host's user templates against the object store; keeping them", "removed", n, "err", err)
		} else if n > 0 {
			log.Info("removed copies of user templates deleted while this host was away", "removed", n)
		}
	}
	recovered := ag.Recover(ctx)
	if n := len(recovered); n > 0 {
		log.Info("recovered sandboxes from the previous run", "found", n, "adopted", len(adoptedIDs(recovered)))
	}
	if err := bakeOnStart(ctx, cfg, ag, out); err != nil {
		return err
	}

	keepRunning = false
	opts := cfg.serveOptions(log.With("part", "hostapi"))
	opts.bodyMayIdle = hostapi.BodyMayIdle
	sv := startServing(tls.NewListener(ln, creds.Config), hsrv, opts)
	fmt.Fprintf(out, "PandaStack host agent listening on https://%s (accel %s, data %s, token in %s, CA in %s)\n", ln.Addr(), ag.Accel(), cfg.DataDir, tokenFile, creds.CAFile)
	log.Info("serving host api", "addr", ln.Addr().String())
	joinCtx, stopJoin := context.WithCancel(ctx)
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		if jc != nil {
			join(joinCtx, jc, ag, cfg.DataDir, out, log.With("part", "join"))
		}
	}()
	defer func() { stopJoin(); <-joined }()
	if err := sv.wait(ctx); err != nil {
		return err
	}
	log.Info("shutting down", "on_shutdown", cfg.OnShutdown)
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hsrv.Shutdown(dctx); err != nil {
		log.Warn("requests still running at shutdown", "err", err)
	}
	if cfg.OnShutdown == "keep" {
		keepRunning = true
	} else {
		if vmmsRunning(ag) {
			// The control plane learns why these sandboxes stop only from
			// the event stream: give it a moment to (re)connect.
			wctx, wcancel := context.WithTimeout(context.Background(), subscriberWait)
			if !hsrv.WaitSubscriber(wctx) {
				log.Warn("no control plane follows the host's events: it will see the sandboxes stopped at shutdown as exited")
			}
			wcancel()
		}
		stopRunning(ag, func(id string) error {
			err := ag.Kill(dctx, id)
			if err == nil {
				hsrv.SandboxExited(id, host.ErrHostShutdown)
			}
			if errors.Is(err, host.ErrNotFound) {
				return nil // exited by itself meanwhile: reported then
			}
			return err
		}, log)
	}
	hsrv.Close() // event streams end: the HTTP server can stop
	sv.stop()
	return nil
}

// subscriberWait bounds how long a shutting-down agent waits for a control
// plane to follow its events before it stops its sandboxes.
const subscriberWait = 5 * time.Second

// RunServer runs the control plane (`panda server`): the REST API, the TTL
// loop and the catalog, with the sandboxes of the host agent at
// cfg.AgentURL, until ctx ends. It waits for the agent to answer, follows
// its event stream (VMM exits) and reconciles the catalog with the agent's
// sandboxes before it serves and whenever the stream reconnects. Its
// shutdown leaves the agent's sandboxes running: they are the agent's.
func RunServer(ctx context.Context, cfg Config, version string, openapi []byte, out io.Writer, log *slog.Logger) error {
	if cfg.Fleet {
		return runFleet(ctx, cfg, version, openapi, out, log)
	}
	if cfg.TemplateHost != "" {
		return errors.New("config: --template-host names a host of a fleet: it needs --fleet")
	}
	agents := cfg.Agents()
	if len(agents) != 1 {
		return fmt.Errorf("config: %d host agents; panda server drives exactly one", len(agents))
	}
	ep := agents[0]
	if err := ep.check(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	ln, release, err := prepare(cfg, lockControl)
	if err != nil {
		return err
	}
	defer release()
	token, err := hostwire.ReadToken(ep.TokenFile)
	if err != nil {
		return err
	}
	tlsCfg, err := hostclient.ClientTLS(ep.CAFile)
	if err != nil {
		return fmt.Errorf("%w (panda agent writes its CA to DATA_DIR/%s; give it with --agent-ca-file)", err, hostapi.CAFile)
	}
	client, err := dialAgent(ctx, ep.URL, token, tlsCfg, log)
	if err != nil {
		return err
	}
	defer client.Close()

	cp, srv, cat, err := openControlPlane(ctx, cfg, client, client.Builds(), version, openapi, out, log)
	if err != nil {
		return err
	}
	defer cat.Close()

	// Follow the agent's events; serve once the first reconciliation is
	// done.
	synced := make(chan struct{})
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		first := true
		client.Watch(watchCtx, hostclient.Watcher{
			Connected: func(ctx context.Context) error {
				if err := cp.Resync(ctx, client.List); err != nil {
					return err
				}
				if first {
					first = false
					close(synced)
				}
				return nil
			},
			Exited: cp.SandboxExited,
		})
	}()
	defer func() { stopWatch(); <-watchDone }()
	select {
	case <-synced:
	case <-ctx.Done():
		return nil
	}

	sv := startServing(ln, srv.Handler(), cfg.serveOptions(log), cp.Run)
	sv.hs.RegisterOnShutdown(srv.CloseStreams) // event streams would hold Shutdown
	fmt.Fprintf(out, "PandaStack listening on http://%s (host agent %s, accel %s)\n", ln.Addr(), cfg.AgentURL, client.Accel())
	log.Info("serving", "addr", ln.Addr().String(), "agent", cfg.AgentURL)
	if err := sv.wait(ctx); err != nil {
		return err
	}
	// Shutdown, in reverse: requests and the TTL loop, then (deferred) the
	// event stream, the catalog, the connection to the agent.
	log.Info("shutting down")
	sv.stop()
	srv.Shutdown()
	octx, ocancel := context.WithTimeout(context.Background(), 30*time.Second)
	cp.Shutdown(octx)
	ocancel()
	return nil
}

// dialAgent connects to the host agent, waiting for it to come up; a
// rejected token or an untrusted certificate is an error at once.
func dialAgent(ctx context.Context, url, token string, tlsCfg *tls.Config, log *slog.Logger) (*hostclient.Client, error) {
	backoff := 100 * time.Millisecond
	for waited := false; ; waited = true {
		c, err := hostclient.Dial(url, token, hostclient.WithLogger(log.With("part", "hostapi")), hostclient.WithTLS(tlsCfg))
		if err == nil {
			if waited {
				log.Info("host agent is up", "agent", url)
			}
			return c, nil
		}
		if errors.Is(err, hostclient.ErrUntrusted) {
			return nil, fmt.Errorf("cannot connect to host agent: %w (is agent_ca_file the CA the agent made, DATA_DIR/%s of the agent?)", err, hostapi.CAFile)
		}
		if !errors.Is(err, host.ErrUnavailable) {
			return nil, fmt.Errorf("cannot connect to host agent: %w", err)
		}
		if !waited {
			log.Warn("waiting for the host agent", "agent", url, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cannot connect to host agent: %w", err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// JoinTokenFile is the join token's file: cfg.JoinTokenFile, or
// DATA_DIR/join.token.
func JoinTokenFile(cfg Config) string {
	if cfg.JoinTokenFile != "" {
		return cfg.JoinTokenFile
	}
	return filepath.Join(cfg.DataDir, "join.token")
}

// runFleet runs the control plane of a fleet (`panda server --fleet`):
// host agents join it (panda agent --server URL --token T) and it places
// sandboxes on them. It makes the join token on first start.
func runFleet(ctx context.Context, cfg Config, version string, openapi []byte, out io.Writer, log *slog.Logger) error {
	ln, release, err := prepare(cfg, lockControl)
	if err != nil {
		return err
	}
	defer release()
	tokenFile := JoinTokenFile(cfg)
	joinToken, created, err := hostapi.LoadOrCreateToken(tokenFile)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "Created the join token in %s (mode 0600): host agents join with panda agent --server URL --token $(cat %s).\n", tokenFile, tokenFile)
	}
	var reg *fleet.Registry
	var templates *fleet.Templates
	cp, srv, cat, err := openControlPlaneOf(ctx, cfg, func(cat catalog.Catalog) (host.Host, rest.Fleet, rest.TemplateBuilds) {
		reg = fleet.New(fleet.Config{Catalog: cat, JoinToken: joinToken, LostAfter: time.Duration(cfg.HostLostAfter),
			Logger: log.With("part", "fleet")})
		templates = fleet.NewTemplates(reg, cfg.TemplateHost)
		return fleet.NewRouter(reg, cat), reg, templates
	}, version, openapi, out, log)
	if err != nil {
		return err
	}
	defer cat.Close()
	connected := func(ctx context.Context, id string, list func(context.Context) ([]host.Info, error)) error {
		templates.HostConnected(ctx, id)
		return cp.ResyncHost(ctx, id, list)
	}
	reg.SetHooks(fleet.Hooks{Connected: connected, Exited: cp.SandboxExited, LostChanged: cp.HostLostChanged})
	if err := reg.Start(ctx); err != nil {
		return err
	}
	defer reg.Close()
	if err := templates.Watch(ctx); err != nil {
		return err
	}
	defer templates.Close()

	sv := startServing(ln, srv.Handler(), cfg.serveOptions(log), cp.Run, reg.Run)
	sv.hs.RegisterOnShutdown(srv.CloseStreams) // event streams would hold Shutdown
	fmt.Fprintf(out, "PandaStack listening on http://%s (a fleet: hosts join with the token in %s)\n", ln.Addr(), tokenFile)
	log.Info("serving", "addr", ln.Addr().String(), "fleet", true)
	if err := sv.wait(ctx); err != nil {
		return err
	}
	log.Info("shutting down")
	sv.stop()
	srv.Shutdown()
	octx, ocancel := context.WithTimeout(context.Background(), 30*time.Second)
	cp.Shutdown(octx)
	ocancel()
	return nil
}
