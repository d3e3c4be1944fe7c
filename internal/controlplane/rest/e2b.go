package rest

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/e2b"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// e2bBackend gives package e2b (the E2B-compatible API served on the same
// listener) PandaStack's keys, sandboxes and guests, with the REST API's
// validation, quotas and error classes.
type e2bBackend struct{ s *Server }

var _ e2b.Backend = e2bBackend{}

// newE2B returns the E2B layer; its envd access tokens are derived from
// the URL secret, so they live as long as signed port URLs do.
func (s *Server) newE2B() (*e2b.Server, error) {
	m := hmac.New(sha256.New, s.urlSecret)
	m.Write([]byte("e2b"))
	return e2b.New(e2bBackend{s}, m.Sum(nil), s.cfg.ProxyDomain, s.log)
}

func (b e2bBackend) key(ctx context.Context, keyID string) (catalog.Key, error) {
	k, err := b.s.cat.GetKey(ctx, keyID)
	if err != nil {
		return k, fmt.Errorf("get api key: %w", err)
	}
	return k, nil
}

func (b e2bBackend) Authenticate(ctx context.Context, secret string) (string, error) {
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+secret)
	c, err := b.s.keyOf(r, "missing API key")
	if err != nil {
		return "", err
	}
	return c.Key.ID, nil
}

func (b e2bBackend) toE2B(sb catalog.Sandbox) e2b.Sandbox {
	out := e2b.Sandbox{ID: sb.ID, Template: sb.Template, State: sb.State, Metadata: sb.Metadata,
		MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs, DiskMiB: sb.DiskMiB, CreatedAt: sb.CreatedAt, ExpiresAt: sb.ExpiresAt,
		Network: e2b.Network(sb.Network), OnExpire: sb.OnExpire}
	for _, m := range b.s.toJSON(sb).Volumes {
		out.Volumes = append(out.Volumes, e2b.VolumeMount{Name: m.Name, Path: m.Path})
	}
	return out
}

func (b e2bBackend) Create(ctx context.Context, keyID string, req e2b.CreateRequest) (e2b.Sandbox, error) {
	key, err := b.key(ctx, keyID)
	if err != nil {
		return e2b.Sandbox{}, err
	}
	creq := controlplane.CreateRequest{Template: req.Template, TTLSeconds: req.TTLSeconds, Metadata: req.Metadata, Env: req.Env, OnExpire: req.OnExpire}
	for _, m := range req.Volumes {
		creq.Volumes = append(creq.Volumes, controlplane.VolumeMountRequest{Name: m.Name, Path: m.Path})
	}
	if req.Network != nil {
		if creq.Network, err = json.Marshal(catalog.Network(*req.Network)); err != nil {
			return e2b.Sandbox{}, err
		}
	}
	sb, err := b.s.cp.Create(ctx, key, creq)
	if err != nil {
		return e2b.Sandbox{}, err
	}
	return b.toE2B(sb), nil
}

func (b e2bBackend) Running(ctx context.Context) ([]string, error) {
	sbs, err := b.s.cat.ListSandboxes(ctx, catalog.SandboxFilter{States: []string{catalog.StateRunning}})
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.ID
	}
	return ids, nil
}

// AcquireGuest counts an envd request against the same guest-request
// limits as the REST API's exec and file calls (limitGuest): per sandbox,
// and per key for the key that owns the sandbox (the request proved
// access with the sandbox's token, which names no key).
func (b e2bBackend) AcquireGuest(ctx context.Context, id string) (func(), error) {
	sb, err := b.s.cat.GetSandbox(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, notFound("sandbox %q not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox: %w", err)
	}
	return b.s.guests.acquire(sb.ID, sb.KeyID)
}

func (b e2bBackend) MaxUploadBytes() int64 { return b.s.cfg.MaxUploadBytes }

// Proxy sends an E2B request for a port of a sandbox's guest (the code
// interpreter's), which the E2B layer authenticated with the sandbox's
// token, through the port proxy (proxyTo) as a request of the sandbox's
// key: its guards drop every credential of this server, E2B's tokens
// whatever they hold (proxyTarget.e2b), and it counts against the
// proxy's limits. It came to the API's address (E2B_SANDBOX_URL), or by
// its host on the proxy domain, an origin of its own. What reaching the
// guest fails with (a host that cannot dial guests, nothing listening) is
// answered by the proxy (proxyTo, guestProxy.fail).
func (b e2bBackend) Proxy(w http.ResponseWriter, r *http.Request, id string, port int) error {
	sb, err := b.s.cat.GetSandbox(r.Context(), id)
	if errors.Is(err, catalog.ErrNotFound) {
		return notFound("sandbox %q not found", id)
	}
	if err != nil {
		return fmt.Errorf("get sandbox: %w", err)
	}
	if sb.State != catalog.StateRunning {
		return conflict("sandbox %s is %s, not running", sb.ID, sb.State)
	}
	_, _, domain := b.s.proxyHost(r.Host)
	b.s.proxyTo(w, r, &proxyTarget{sb: sb, port: port, path: r.URL.EscapedPath(), query: r.URL.RawQuery, domain: domain, e2b: true})
	return nil
}

func (b e2bBackend) Get(ctx context.Context, keyID, id string) (e2b.Sandbox, error) {
	sb, err := b.s.cp.Sandbox(ctx, keyID, id)
	if err != nil {
		return e2b.Sandbox{}, err
	}
	return b.toE2B(sb), nil
}

func (b e2bBackend) List(ctx context.Context, keyID string, f e2b.ListFilter) ([]e2b.Sandbox, error) {
	states := f.States
	if len(states) == 0 {
		states = controlplane.LiveStates
	}
	list, err := b.s.cat.ListSandboxes(ctx, catalog.SandboxFilter{KeyID: keyID, States: states, Metadata: f.Metadata})
	if err != nil {
		return nil, err
	}
	out := make([]e2b.Sandbox, 0, len(list))
	for _, sb := range list {
		out = append(out, b.toE2B(sb))
	}
	return out, nil
}

func (b e2bBackend) Kill(ctx context.Context, keyID, id string) error {
	if _, err := b.Get(ctx, keyID, id); err != nil {
		return err
	}
	return b.s.cp.Stop(ctx, id, "killed")
}

func (b e2bBackend) SetTTL(ctx context.Context, keyID, id string, seconds int) error {
	if _, err := b.Get(ctx, keyID, id); err != nil {
		return err
	}
	ttl, err := b.s.cp.TTL(&seconds)
	if err != nil {
		return err
	}
	_, err = b.s.cp.SetTTL(ctx, id, ttl)
	return err
}

func (b e2bBackend) SetNetwork(ctx context.Context, keyID, id string, n e2b.Network) error {
	sb, err := b.s.cp.Sandbox(ctx, keyID, id)
	if err != nil {
		return err
	}
	_, err = b.s.cp.SetNetwork(ctx, sb, netpolicy.Policy{Internet: n.Internet, AllowOut: n.AllowOut, DenyOut: n.DenyOut})
	return err
}

func (b e2bBackend) Guest(ctx context.Context, id string) (host.Guest, error) {
	sb, err := b.s.cat.GetSandbox(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, notFound("sandbox %q not found", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox: %w", err)
	}
	if sb.State != catalog.StateRunning {
		return nil, conflict("sandbox %s is %s, not running", sb.ID, sb.State)
	}
	return b.s.host.Guest(ctx, id)
}

func (b e2bBackend) Status(err error) (int, string) {
	ae := classify(err)
	return ae.Status, strings.TrimSpace(ae.Message)
}

func (b e2bBackend) Pause(ctx context.Context, keyID, id string) error {
	if _, err := b.Get(ctx, keyID, id); err != nil {
		return err
	}
	_, err := b.s.cp.Pause(ctx, id)
	return err
}

func (b e2bBackend) Resume(ctx context.Context, keyID, id string) (e2b.Sandbox, error) {
	if _, err := b.Get(ctx, keyID, id); err != nil {
		return e2b.Sandbox{}, err
	}
	sb, err := b.s.cp.ResumeOn(ctx, id, scheduler.Placement{}) // off a draining host, as the REST API's
	if err != nil {
		return e2b.Sandbox{}, err
	}
	return b.toE2B(sb), nil
}

func (b e2bBackend) Fork(ctx context.Context, keyID, id string, count int, ttlSeconds *int) ([]e2b.ForkChild, error) {
	if count < 1 || count > controlplane.MaxForkCount {
		return nil, invalid("count must be between 1 and %d", controlplane.MaxForkCount)
	}
	var ttl time.Duration
	if ttlSeconds != nil {
		var err error
		if ttl, err = b.s.cp.TTL(ttlSeconds); err != nil {
			return nil, err
		}
	}
	key, err := b.key(ctx, keyID)
	if err != nil {
		return nil, err
	}
	parent, err := b.s.cp.Sandbox(ctx, keyID, id)
	if err != nil {
		return nil, err
	}
	if parent.State != catalog.StateRunning {
		return nil, conflict("sandbox %s is %s, not running", parent.ID, parent.State)
	}
	res, err := b.s.cp.Fork(ctx, key, parent, count, scheduler.Placement{}, controlplane.VolumeShare)
	if err != nil {
		return nil, err
	}
	out := make([]e2b.ForkChild, len(res.Children))
	for i, c := range res.Children {
		switch {
		case c.Err != nil:
			out[i].Err = c.Err
		case c.Sandbox != nil:
			sb, err := b.s.cat.GetSandbox(ctx, c.Sandbox.ID)
			if err == nil && ttlSeconds != nil {
				sb, err = b.s.cp.SetTTL(ctx, sb.ID, ttl)
			}
			if err != nil {
				out[i].Err = err
				continue
			}
			out[i].Sandbox = b.toE2B(sb)
		}
	}
	return out, nil
}
