// Package fleet is the control plane's registry of host agents: hosts
// that joined (`panda agent --server URL --token T` registers, then
// heartbeats) and hosts given by configuration (`panda up`'s own agent,
// `panda server --agent URL`). It implements control.Fleet — each host's
// client and an inventory for the scheduler — keeps each registered host's
// record in the catalog (so a restarted control plane, or another replica
// sharing a PostgreSQL catalog, knows its hosts), follows each host's
// event stream (exits, and a resync whenever the stream reconnects), and
// marks a host that stops heartbeating lost after Config.LostAfter. A lost
// host that heartbeats again is ready again (or draining, if it was).
//
// Who may register: a holder of the join token (Config.JoinToken), which
// `panda server` makes on first start (DATA_DIR/join.token). A host that
// registers again under a known id must present the agent token it first
// registered with: the join token alone cannot take over another host's
// sandboxes (an operator forgets a host first, DELETE /v1/hosts/{id}).
package fleet

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// Defaults.
const (
	// DefaultHeartbeat is how often agents heartbeat.
	DefaultHeartbeat = 2 * time.Second
	// DefaultLostAfter is how long a host may stay silent before it is
	// lost: five heartbeats.
	DefaultLostAfter = 5 * DefaultHeartbeat
)

// Config configures a Registry.
type Config struct {
	Catalog catalog.Catalog
	// JoinToken is the secret an agent presents to register and
	// heartbeat ("": no host may register).
	JoinToken string
	// LostAfter: a registered host silent for longer is lost (default
	// DefaultLostAfter).
	LostAfter time.Duration
	Logger    *slog.Logger
	// Now is the clock of heartbeats (default time.Now), for tests.
	Now func() time.Time
}

// Hooks are how the registry tells the control plane about its hosts.
type Hooks struct {
	// Connected runs when a host's event stream (re)connects: the plane
	// reconciles its records of the host with what list returns.
	Connected func(ctx context.Context, hostID string, list func(context.Context) ([]host.Info, error)) error
	// Exited is told that a host's sandbox stopped by itself.
	Exited func(id string, cause error)
	// LostChanged, if set, is told that a host was marked lost or came
	// back (its sandboxes' state as users see it changed).
	LostChanged func(ctx context.Context, hostID string)
}

// lostChanged calls Hooks.LostChanged, if set.
func (r *Registry) lostChanged(ctx context.Context, id string) {
	r.mu.Lock()
	f := r.hooks.LostChanged
	r.mu.Unlock()
	if f != nil {
		f(ctx, id)
	}
}

// Registry is the fleet. Safe for concurrent use.
type Registry struct {
	cfg Config
	log *slog.Logger

	life     context.Context
	stopLife context.CancelFunc
	wg       sync.WaitGroup

	mu      sync.Mutex
	hooks   Hooks
	members map[string]*member
}

type member struct {
	rec    catalog.Host
	h      host.Host          // nil until a registered host could be dialled
	client *hostclient.Client // a registered host's
	static bool
	load   host.Load
	loaded bool      // load was reported
	loadAt time.Time // when, by cfg.Now
	beat   time.Time // last heartbeat, by cfg.Now
	stop   context.CancelFunc
	done   chan struct{}
}

var _ controlplane.Registry = (*Registry)(nil)

// Errors of registration, each of a class of internal/contract/errs.
var (
	// ErrJoinToken: the join token is missing or wrong.
	ErrJoinToken = errs.New(errs.Unauthorized, "join token rejected")
	// ErrHostToken: a known host registered with another agent token.
	ErrHostToken = errs.New(errs.Conflict, "host already registered with another agent token")
	// ErrInvalid: a registration that cannot be used.
	ErrInvalid = errs.New(errs.Invalid, "invalid registration")
)

// New returns a registry. Start loads the hosts the catalog knows; Run
// marks silent hosts lost.
func New(cfg Config) *Registry {
	if cfg.LostAfter <= 0 {
		cfg.LostAfter = DefaultLostAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Registry{cfg: cfg, log: cfg.Logger, members: map[string]*member{}}
	r.life, r.stopLife = context.WithCancel(context.Background())
	return r
}

// SetHooks sets the hooks (before Start).
func (r *Registry) SetHooks(h Hooks) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hooks = h
}

// AddStatic adds host h named id, given by configuration: always ready
// (no heartbeats), never stored in the catalog. capacity may be zero
// (unknown: placement never refuses it for room).
func (r *Registry) AddStatic(id string, h host.Host, capacity host.Capacity) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.members[id] = &member{rec: catalog.Host{ID: id, State: catalog.HostReady, Capacity: catalog.HostCapacity(capacity)}, h: h, static: true}
}

// Start loads the registered hosts of the catalog and connects to each in
// the background (a host that cannot be reached is lost once LostAfter
// passes without a heartbeat).
func (r *Registry) Start(ctx context.Context) error {
	recs, err := r.cfg.Catalog.ListHosts(ctx)
	if err != nil {
		return fmt.Errorf("load hosts: %w", err)
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range recs {
		if _, ok := r.members[rec.ID]; ok {
			continue
		}
		// It has LostAfter from now to heartbeat this control plane.
		m := &member{rec: rec, beat: now}
		r.members[rec.ID] = m
		r.connect(m)
	}
	return nil
}

// Close stops following the hosts and closes their clients.
func (r *Registry) Close() {
	r.stopLife()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.members {
		if m.client != nil {
			m.client.Close()
		}
	}
}

// connect dials m's agent and follows its events, in the background,
// until m is replaced or the registry closes. Called with r.mu held.
func (r *Registry) connect(m *member) {
	if m.stop != nil {
		m.stop()
	}
	ctx, stop := context.WithCancel(r.life)
	m.stop = stop
	done := make(chan struct{})
	m.done = done
	rec := m.rec
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(done)
		c, err := r.dial(ctx, rec)
		if err != nil {
			return // ctx ended
		}
		r.mu.Lock()
		if r.members[rec.ID] != m || ctx.Err() != nil {
			r.mu.Unlock()
			c.Close()
			return
		}
		m.client, m.h = c, c
		hooks := r.hooks
		r.mu.Unlock()
		r.log.Info("connected to host", "host_id", rec.ID, "url", rec.URL)
		c.Watch(ctx, hostclient.Watcher{
			Connected: func(ctx context.Context) error {
				if hooks.Connected == nil {
					return nil
				}
				return hooks.Connected(ctx, rec.ID, c.List)
			},
			Exited: func(id string, cause error) {
				if hooks.Exited != nil {
					hooks.Exited(id, cause)
				}
			},
		})
	}()
}

// dial connects to a registered host, retrying with backoff until it
// answers or ctx ends.
func (r *Registry) dial(ctx context.Context, rec catalog.Host) (*hostclient.Client, error) {
	tlsCfg, err := hostclient.ClientTLSFromPEM([]byte(rec.CACert))
	backoff := 100 * time.Millisecond
	for {
		if err == nil {
			var c *hostclient.Client
			c, err = hostclient.Dial(rec.URL, rec.Token, hostclient.WithTLS(tlsCfg), hostclient.WithCACert(rec.CACert), hostclient.WithLogger(r.log.With("host_id", rec.ID)))
			if err == nil {
				return c, nil
			}
			r.log.Warn("cannot reach host", "host_id", rec.ID, "url", rec.URL, "err", err, "retry_ms", backoff.Milliseconds())
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
		if tlsCfg == nil {
			tlsCfg, err = hostclient.ClientTLSFromPEM([]byte(rec.CACert))
		}
	}
}

// CheckJoinToken reports whether token is the join token.
func (r *Registry) CheckJoinToken(token string) error {
	if r.cfg.JoinToken == "" || subtle.ConstantTimeCompare([]byte(token), []byte(r.cfg.JoinToken)) != 1 {
		return ErrJoinToken
	}
	return nil
}

// Register adds or updates host reg.ID (see the package doc for who may)
// and connects to it. It returns the host's record.
func (r *Registry) Register(ctx context.Context, reg host.Registration) (catalog.Host, error) {
	if !host.ValidHostID(reg.ID) {
		return catalog.Host{}, fmt.Errorf("%w: host id %q: 1-63 of a-z, 0-9 and '-', not starting with '-'", ErrInvalid, reg.ID)
	}
	if u, err := url.Parse(reg.URL); err != nil || u.Scheme != "https" || u.Host == "" {
		return catalog.Host{}, fmt.Errorf("%w: url %q: want https://HOST:PORT", ErrInvalid, reg.URL)
	}
	if reg.Token == "" {
		return catalog.Host{}, fmt.Errorf("%w: no agent token", ErrInvalid)
	}
	if _, err := hostclient.ClientTLSFromPEM([]byte(reg.CACert)); err != nil {
		return catalog.Host{}, fmt.Errorf("%w: ca_cert: %v", ErrInvalid, err)
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	old, known := r.members[reg.ID]
	if known && old.static {
		return catalog.Host{}, fmt.Errorf("%w: host %s is this server's own", ErrHostToken, reg.ID)
	}
	rec := catalog.Host{ID: reg.ID, URL: reg.URL, Token: reg.Token, CACert: reg.CACert, State: catalog.HostReady,
		Capacity: catalog.HostCapacity(reg.Capacity), RegisteredAt: now.UTC(), HeartbeatAt: now.UTC()}
	if stored, err := r.cfg.Catalog.GetHost(ctx, reg.ID); err == nil {
		if subtle.ConstantTimeCompare([]byte(stored.Token), []byte(reg.Token)) != 1 {
			return catalog.Host{}, fmt.Errorf("%w: %s (forget it first: DELETE /v1/hosts/%s)", ErrHostToken, reg.ID, reg.ID)
		}
		rec.RegisteredAt, rec.Draining = stored.RegisteredAt, stored.Draining
		if stored.Draining {
			rec.State = catalog.HostDraining
		}
	} else if !errors.Is(err, catalog.ErrNotFound) {
		return catalog.Host{}, err
	}
	if err := r.cfg.Catalog.PutHost(ctx, rec); err != nil {
		return catalog.Host{}, err
	}
	m := &member{rec: rec, beat: now, load: reg.Load, loaded: true, loadAt: now}
	if known {
		if old.stop != nil {
			old.stop()
		}
		if old.client != nil {
			old.client.Close()
		}
	}
	r.members[reg.ID] = m
	r.connect(m)
	r.log.Info("host registered", "host_id", reg.ID, "url", reg.URL, "cpus", reg.Capacity.CPUs,
		"memory_mib", reg.Capacity.MemoryMiB, "accel", reg.Capacity.Accel, "again", known)
	return rec, nil
}

// Heartbeat records that host id is alive with load. catalog.ErrNotFound
// if the registry does not know it (the agent registers again).
func (r *Registry) Heartbeat(ctx context.Context, id, token string, load host.Load) error {
	now := r.cfg.Now()
	r.mu.Lock()
	m, ok := r.members[id]
	if !ok || m.static {
		r.mu.Unlock()
		return fmt.Errorf("host %s: %w", id, catalog.ErrNotFound)
	}
	if subtle.ConstantTimeCompare([]byte(m.rec.Token), []byte(token)) != 1 {
		r.mu.Unlock()
		return ErrHostToken
	}
	m.beat, m.load, m.loaded, m.loadAt = now, load, true, now
	wasLost := m.rec.State == catalog.HostLost
	r.mu.Unlock()
	rec, err := r.cfg.Catalog.UpdateHost(ctx, id, func(h *catalog.Host) error {
		h.HeartbeatAt = now.UTC()
		if h.State == catalog.HostLost {
			h.State = catalog.HostReady
			if h.Draining {
				h.State = catalog.HostDraining
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	if r.members[id] == m {
		m.rec.State, m.rec.HeartbeatAt = rec.State, rec.HeartbeatAt
	}
	r.mu.Unlock()
	if wasLost {
		r.log.Info("host is back", "host_id", id, "state", rec.State)
		r.lostChanged(ctx, id)
	}
	return nil
}

// Run marks hosts lost that have not heartbeat for LostAfter, until ctx
// ends.
func (r *Registry) Run(ctx context.Context) error {
	tick := time.NewTicker(min(r.cfg.LostAfter/4, time.Second))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		r.markLost(ctx)
	}
}

// markLost marks silent hosts lost.
func (r *Registry) markLost(ctx context.Context) {
	now := r.cfg.Now()
	var lost []string
	r.mu.Lock()
	for id, m := range r.members {
		if !m.static && m.rec.State != catalog.HostLost && now.Sub(m.beat) > r.cfg.LostAfter {
			lost = append(lost, id)
		}
	}
	r.mu.Unlock()
	for _, id := range lost {
		rec, err := r.cfg.Catalog.UpdateHost(ctx, id, func(h *catalog.Host) error {
			h.State = catalog.HostLost
			return nil
		})
		if err != nil {
			r.log.Warn("mark host lost", "host_id", id, "err", err)
			continue
		}
		r.mu.Lock()
		if m := r.members[id]; m != nil && now.Sub(m.beat) > r.cfg.LostAfter {
			m.rec.State = rec.State
		}
		r.mu.Unlock()
		r.log.Warn("host lost: no heartbeat", "host_id", id, "after", r.cfg.LostAfter)
		r.lostChanged(ctx, id)
	}
}

// SetDraining sets or clears host id's drain (no new placements).
func (r *Registry) SetDraining(ctx context.Context, id string, draining bool) (catalog.Host, error) {
	r.mu.Lock()
	m, ok := r.members[id]
	r.mu.Unlock()
	if !ok {
		return catalog.Host{}, fmt.Errorf("host %s: %w", id, catalog.ErrNotFound)
	}
	if m.static {
		r.mu.Lock()
		defer r.mu.Unlock()
		m.rec.Draining = draining
		m.rec.State = catalog.HostReady
		if draining {
			m.rec.State = catalog.HostDraining
		}
		return m.rec, nil
	}
	rec, err := r.cfg.Catalog.UpdateHost(ctx, id, func(h *catalog.Host) error {
		h.Draining = draining
		if h.State != catalog.HostLost {
			h.State = catalog.HostReady
			if draining {
				h.State = catalog.HostDraining
			}
		}
		return nil
	})
	if err != nil {
		return catalog.Host{}, err
	}
	r.mu.Lock()
	if r.members[id] == m {
		m.rec.State, m.rec.Draining = rec.State, rec.Draining
	}
	r.mu.Unlock()
	r.log.Info("host drain", "host_id", id, "draining", draining)
	return rec, nil
}

// Forget removes host id (a static one cannot be).
func (r *Registry) Forget(ctx context.Context, id string) error {
	r.mu.Lock()
	m, ok := r.members[id]
	if ok && m.static {
		r.mu.Unlock()
		return fmt.Errorf("%w: host %s is this server's own", ErrInvalid, id)
	}
	delete(r.members, id)
	r.mu.Unlock()
	if ok {
		if m.stop != nil {
			m.stop()
		}
		if m.client != nil {
			m.client.Close()
		}
	}
	if err := r.cfg.Catalog.DeleteHost(ctx, id); err != nil && (ok || !errors.Is(err, catalog.ErrNotFound)) {
		return err
	}
	if !ok {
		return fmt.Errorf("host %s: %w", id, catalog.ErrNotFound)
	}
	r.log.Info("host forgotten", "host_id", id)
	return nil
}

// Host implements control.Fleet.
func (r *Registry) Host(id string) (host.Host, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.members[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("host %q: %w", id, controlplane.ErrUnknownHost)
	case m.rec.State == catalog.HostLost:
		return nil, fmt.Errorf("host %s: %w", id, controlplane.ErrHostLost)
	case m.h == nil:
		return nil, fmt.Errorf("host %s is not connected yet: %w", id, host.ErrUnavailable)
	}
	return m.h, nil
}

// Statuses describes every host, by id.
func (r *Registry) Statuses() []controlplane.HostStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]controlplane.HostStatus, 0, len(r.members))
	for _, m := range r.members {
		out = append(out, controlplane.HostStatus{Record: m.rec, Static: m.static, Connected: m.h != nil, Load: m.load, Loaded: m.loaded, LoadAt: m.loadAt})
	}
	slices.SortFunc(out, func(a, b controlplane.HostStatus) int { return cmpString(a.Record.ID, b.Record.ID) })
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// HostState implements control.Fleet.
func (r *Registry) HostState(id string) scheduler.HostState {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.members[id]
	switch {
	case !ok:
		return ""
	case m.h == nil && m.rec.State == catalog.HostReady:
		return scheduler.Lost // not reachable yet, as Inventory says
	}
	return scheduler.HostState(m.rec.State)
}

// Inventory implements control.Fleet: every host with its state, its
// capacity and its last load, and the live sandboxes the catalog places
// on it. A host's free memory is its last report's less the scheduler's
// estimate for each sandbox placed on it since (created after the
// report): a burst of creates between two heartbeats must not all count
// the same free memory.
func (r *Registry) Inventory(ctx context.Context) []scheduler.Host {
	statuses := r.Statuses()
	loadAt := map[string]time.Time{}
	for _, st := range statuses {
		if st.Loaded {
			loadAt[st.Record.ID] = st.LoadAt
		}
	}
	count := map[string]int{}
	vcpus := map[string]int{}
	since := map[string]int64{}
	if live, err := r.cfg.Catalog.ListSandboxes(ctx, catalog.SandboxFilter{States: controlplane.LiveStates}); err == nil {
		for _, sb := range live {
			count[sb.HostID]++
			vcpus[sb.HostID] += sb.VCPUs
			if at, ok := loadAt[sb.HostID]; ok && sb.CreatedAt.After(at) {
				since[sb.HostID] += scheduler.Estimate(sb.MemoryMiB)
			}
		}
	} else {
		r.log.Warn("inventory: list sandboxes", "err", err)
	}
	var out []scheduler.Host
	for _, st := range statuses {
		rec := st.Record
		h := scheduler.Host{ID: rec.ID, State: scheduler.HostState(rec.State), CPUs: rec.Capacity.CPUs,
			MemoryMiB: rec.Capacity.MemoryMiB, DiskFreeMiB: rec.Capacity.DiskMiB,
			Sandboxes: count[rec.ID], VCPUs: vcpus[rec.ID], FreeMemoryMiB: rec.Capacity.MemoryMiB}
		if st.Loaded {
			h.FreeMemoryMiB, h.DiskFreeMiB, h.WarmTemplates = st.Load.FreeMemoryMiB-since[rec.ID], st.Load.DiskFreeMiB, st.Load.Templates
		}
		if st.Static && rec.Capacity.CPUs == 0 {
			// Unknown capacity: the host refuses what it cannot hold.
			h.CPUs, h.MemoryMiB, h.FreeMemoryMiB, h.DiskFreeMiB = 1<<20, 1<<40, 1<<40, 1<<40
		}
		if !st.Connected && h.State == scheduler.Ready {
			h.State = scheduler.Lost // not reachable yet: no placements
		}
		out = append(out, h)
	}
	return out
}

// Classify gives the registry's errors that need it a message for users;
// the others are answered by their class (controlplane.Classify).
func (r *Registry) Classify(err error) error {
	if errors.Is(err, ErrJoinToken) {
		return &controlplane.Error{Kind: controlplane.Unauthorized, Msg: "missing or wrong join token", Err: err}
	}
	return err
}
