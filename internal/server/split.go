package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/hostapi"
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
	c.AgentURL = "http://127.0.0.1:7789"
	return c
}

// AgentTokenFile is the agent token's file: cfg.AgentTokenFile, or
// DATA_DIR/agent.token.
func AgentTokenFile(cfg Config) string {
	if cfg.AgentTokenFile != "" {
		return cfg.AgentTokenFile
	}
	return filepath.Join(cfg.DataDir, "agent.token")
}

// RunAgent runs a host agent and its host API (`panda agent`) until ctx
// ends. It adopts the VMMs an earlier run left running, as Run does; the
// control plane that connects reconciles its catalog with them. On first
// start it writes a random agent token to AgentTokenFile (mode 0600).
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

	host, exits, err := openHost(ctx, cfg, log)
	if err != nil {
		return err
	}
	keepRunning := true // until it serves: see Run
	defer func() { closeHost(host, keepRunning, log) }()
	hsrv := hostapi.NewServer(host, token, log.With("part", "hostapi"))
	defer hsrv.Close()
	exits.set(hsrv.SandboxExited)
	recovered := host.Recover(ctx)
	if n := len(recovered); n > 0 {
		log.Info("recovered sandboxes from the previous run", "found", n, "adopted", countOK(recovered))
	}
	if err := bakeOnStart(ctx, cfg, host, out); err != nil {
		return err
	}

	keepRunning = false
	sv := startServing(ln, hsrv)
	fmt.Fprintf(out, "PandaStack host agent listening on http://%s (accel %s, data %s, token in %s)\n", ln.Addr(), host.Accel(), cfg.DataDir, tokenFile)
	log.Info("serving host api", "addr", ln.Addr().String())
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
		stopRunning(host, func(id string) error {
			err := host.Kill(dctx, id)
			if err == nil {
				hsrv.SandboxExited(id, api.ErrHostShutdown)
			}
			if errors.Is(err, agent.ErrNotFound) {
				return nil // exited by itself meanwhile: reported then
			}
			return err
		}, log)
	}
	hsrv.Close() // event streams end: the HTTP server can stop
	sv.stop()
	return nil
}

// RunServer runs the control plane (`panda server`): the REST API, the TTL
// loop and the catalog, with the sandboxes of the host agent at
// cfg.AgentURL, until ctx ends. It waits for the agent to answer, follows
// its event stream (VMM exits) and reconciles the catalog with the agent's
// sandboxes before it serves and whenever the stream reconnects. Its
// shutdown leaves the agent's sandboxes running: they are the agent's.
func RunServer(ctx context.Context, cfg Config, version string, openapi []byte, out io.Writer, log *slog.Logger) error {
	if cfg.AgentURL == "" {
		return errors.New("config: agent_url is required (the host agent's API, e.g. http://127.0.0.1:7789)")
	}
	ln, release, err := prepare(cfg, lockControl)
	if err != nil {
		return err
	}
	defer release()
	token, err := hostapi.ReadToken(AgentTokenFile(cfg))
	if err != nil {
		return err
	}
	client, err := dialAgent(ctx, cfg.AgentURL, token, log)
	if err != nil {
		return err
	}
	defer client.Close()

	srv, cat, err := openControlPlane(ctx, cfg, client, version, openapi, out, log)
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
		client.Watch(watchCtx, hostapi.Watcher{
			Connected: func(ctx context.Context) error {
				if err := srv.Resync(ctx, client.ListSandboxes); err != nil {
					return err
				}
				if first {
					first = false
					close(synced)
				}
				return nil
			},
			Exited: srv.SandboxExited,
		})
	}()
	defer func() { stopWatch(); <-watchDone }()
	select {
	case <-synced:
	case <-ctx.Done():
		return nil
	}

	sv := startServing(ln, srv.Handler(), srv.Run)
	fmt.Fprintf(out, "PandaStack listening on http://%s (host agent %s, accel %s)\n", ln.Addr(), cfg.AgentURL, client.Accel())
	log.Info("serving", "addr", ln.Addr().String(), "agent", cfg.AgentURL)
	if err := sv.wait(ctx); err != nil {
		return err
	}
	// Shutdown, in reverse: requests and the TTL loop, then (deferred) the
	// event stream, the catalog, the connection to the agent.
	log.Info("shutting down")
	sv.stop()
	octx, ocancel := context.WithTimeout(context.Background(), 30*time.Second)
	srv.Shutdown(octx)
	ocancel()
	return nil
}

// dialAgent connects to the host agent, waiting for it to come up; a
// rejected token is an error at once.
func dialAgent(ctx context.Context, url, token string, log *slog.Logger) (*hostapi.Client, error) {
	backoff := 100 * time.Millisecond
	for waited := false; ; waited = true {
		c, err := hostapi.Dial(url, token, hostapi.WithLogger(log.With("part", "hostapi")))
		if err == nil {
			if waited {
				log.Info("host agent is up", "agent", url)
			}
			return c, nil
		}
		if !errors.Is(err, api.ErrUnavailable) {
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
