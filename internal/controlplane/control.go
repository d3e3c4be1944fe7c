package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/events"
	"github.com/prometheus/client_golang/prometheus"
)

// Config configures a Plane: the daemon that serves it fills it
// (cmd/panda/internal/daemon) and SetDefaults the rest.
type Config struct {
	// HostID names the one host of New (default "local"); NewFleet's
	// hosts are the fleet's.
	HostID string
	// DefaultTTL applies when a create has no TTL (default 5 min); MaxTTL
	// bounds every TTL (default 24 h).
	DefaultTTL time.Duration
	MaxTTL     time.Duration
	// Default per-key quotas (a key's own limits override them; < 0 is
	// unlimited). Disk counts sandbox disks, paused sandboxes, snapshots
	// and volumes. MaxVolumesPerKey bounds the number of a key's volumes
	// (default DefaultMaxVolumesPerKey; no key has its own).
	MaxSandboxesPerKey int
	MaxMemoryMiBPerKey int
	MaxVCPUsPerKey     int
	MaxDiskMiBPerKey   int
	MaxVolumesPerKey   int
	// StoppedRetention is how long stopped sandboxes stay in the catalog
	// (default 1 h).
	StoppedRetention time.Duration
	// Templates is the registry of user templates, those built from
	// images (templates.go says who may use them); nil: built-in
	// templates only.
	Templates builds.Builder
	// The bounds of a key other than an admin one on user templates
	// (builds.go; < 0 unlimited): MaxTemplatesPerKey the templates it
	// owns (default DefaultMaxTemplatesPerKey), MaxTemplateBuildsPerKey
	// its builds queued or running (default
	// DefaultMaxTemplateBuildsPerKey; the API counts its build requests
	// being received too), MaxTemplateVersions the versions one of its
	// templates keeps (default DefaultMaxTemplateVersions): a rebuild of
	// a template with that many is refused until old versions are
	// deleted.
	MaxTemplatesPerKey      int
	MaxTemplateBuildsPerKey int
	MaxTemplateVersions     int
	// ResolveTemplate turns the template a create names into the one the
	// sandbox records (a user template's version, "NAME:N") for key, or
	// refuses it; nil: Plane.ResolveTemplate, over Templates.
	ResolveTemplate func(ctx context.Context, key catalog.Key, name string) (string, error)
	// Gone is told when a sandbox's guest goes away (it stopped or
	// paused), so that connections to it are closed; nil: nothing to tell.
	// OnGone adds more.
	Gone   func(id string)
	Logger *slog.Logger
	// Now is the clock of the times records hold (creation, expiry,
	// stops) and of the TTL loop's decisions; nil: the system clock. Tick,
	// if set, replaces the TTL loop's ticker (every 200 ms). Both are for
	// tests that drive expiry without waiting for it; durations reported
	// in metrics and logs are always measured with the system clock.
	Now  func() time.Time
	Tick <-chan time.Time
	// Events is told of every change of a sandbox or snapshot record the
	// plane writes (publish.go: the Event* types), for its key's
	// subscribers (GET /v1/events); default a hub of its own (Events).
	Events *events.Hub
	// StoreDownAfter is how long a cross-host fork or move waits for a
	// capture whose uploads fail before it gives up with a 503 (default
	// 5 s).
	StoreDownAfter time.Duration
}

// SetDefaults fills in zero fields.
func (c *Config) SetDefaults() {
	if c.HostID == "" {
		c.HostID = "local"
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = 5 * time.Minute
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = 24 * time.Hour
	}
	if c.MaxSandboxesPerKey == 0 {
		c.MaxSandboxesPerKey = 64
	}
	if c.MaxMemoryMiBPerKey == 0 {
		c.MaxMemoryMiBPerKey = 64 << 10
	}
	if c.MaxVCPUsPerKey == 0 {
		c.MaxVCPUsPerKey = 128
	}
	if c.MaxDiskMiBPerKey == 0 {
		c.MaxDiskMiBPerKey = 1 << 20 // 1 TiB
	}
	if c.MaxVolumesPerKey == 0 {
		c.MaxVolumesPerKey = DefaultMaxVolumesPerKey
	}
	if c.StoppedRetention == 0 {
		c.StoppedRetention = time.Hour
	}
	if c.MaxTemplatesPerKey == 0 {
		c.MaxTemplatesPerKey = DefaultMaxTemplatesPerKey
	}
	if c.MaxTemplateBuildsPerKey == 0 {
		c.MaxTemplateBuildsPerKey = DefaultMaxTemplateBuildsPerKey
	}
	if c.MaxTemplateVersions == 0 {
		c.MaxTemplateVersions = DefaultMaxTemplateVersions
	}
	if c.Events == nil {
		c.Events = events.New(nil)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	switch {
	case c.DefaultTTL <= 0 || c.MaxTTL <= 0:
		return errors.New("ttl defaults must be positive")
	case c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("default ttl %s exceeds max ttl %s", c.DefaultTTL, c.MaxTTL)
	}
	return nil
}

// Plane is the control plane of the sandboxes of a fleet of hosts: it
// keeps their records in a catalog and drives each through its host's
// host.Host (Fleet), placing new ones (package scheduler). It creates
// (quota, record, host, rollback), kills, sets TTLs and network policies,
// forks, snapshots, pauses and resumes sandboxes, expires them (Run), and
// reconciles the catalog with its host (Resync). It knows nothing of HTTP:
// its errors are *Error or classified by Classify.
//
// The catalog record is the owner of a sandbox's state as users see it;
// every change of it goes through transition, which applies the lifecycle
// table in the same transaction as the change, so that two actors (a
// request, the TTL loop, a VMM exit, a reconcile) can never silently
// overwrite each other: the second one's transition fails and it knows.
//
// Long operations (pause, resume, snapshot, fork) run detached from the
// request that asked for them: a client that goes away does not cancel
// them, and it learns the outcome later (its record). Pause and resume
// have states of their own (pausing, resuming), so a crash of this server
// in the middle is visible afterwards, and Resync settles them from what
// the host has.
type Plane struct {
	cfg Config
	// cat is the catalog wrapped by publishing: the plane's record writes
	// go through it, and it publishes them (Config.Events).
	cat     catalog.Catalog
	fleet   Fleet
	log     *slog.Logger
	metrics *metrics
	// commands is the sandboxes' command histories (commands.go).
	commands *commands

	// life is the context of detached operations; stopLife cancels it.
	life     context.Context
	stopLife context.CancelFunc

	mu sync.Mutex
	// goneFns are told when a sandbox's guest goes away (Config.Gone,
	// OnGone).
	goneFns []func(id string)
	// busy counts what works on a sandbox (a create, an operation, a TTL
	// expiry) so that Resync and the TTL loop leave it alone.
	busy    map[string]int
	ops     map[string]*op // the detached operation of each sandbox
	opsWG   sync.WaitGroup
	tailsWG sync.WaitGroup // background's
	closing bool
	// hostsMu guards the hosts placements claim and those leaving the
	// fleet (forgethost.go). Its holders call only the fleet's HostState.
	hostsMu    sync.Mutex
	claims     map[string]int  // placements writing a record of each host
	forgetting map[string]bool // hosts ForgetHost is removing
	// resyncAgain is the list of the last Resync that left records
	// unsettled because their host was still in the middle of an
	// operation (one an earlier server started); the TTL loop runs Resync
	// again with it until they settle. Nil: nothing to settle.
	resyncAgain map[string]func(context.Context) ([]host.Info, error)
}

// New returns a control plane over cat and the one host h, named
// cfg.HostID; its metrics are registered with reg. It starts no goroutines
// (Run enforces TTLs).
func New(cfg Config, cat catalog.Catalog, h host.Host, reg prometheus.Registerer) (*Plane, error) {
	cfg.SetDefaults()
	return NewFleet(cfg, cat, SingleHost(cfg.HostID, h), reg)
}

// NewFleet returns a control plane over cat and the hosts of f (cfg.HostID
// names none of them then); its metrics are registered with reg. It starts
// no goroutines.
func NewFleet(cfg Config, cat catalog.Catalog, f Fleet, reg prometheus.Registerer) (*Plane, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("control plane config: %w", err)
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	p := &Plane{cfg: cfg, fleet: f, commands: newCommands(), resyncAgain: map[string]func(context.Context) ([]host.Info, error){}, log: cfg.Logger, metrics: m, busy: map[string]int{}, ops: map[string]*op{},
		claims: map[string]int{}, forgetting: map[string]bool{}}
	p.cat = &publishing{Catalog: cat, p: p}
	p.life, p.stopLife = context.WithCancel(context.Background())
	return p, nil
}

// LiveStates are every state but stopped, as the catalog filters them.
var LiveStates = func() []string {
	var out []string
	for _, st := range lifecycle.Live {
		out = append(out, string(st))
	}
	return out
}()

type metrics struct {
	createSeconds    prometheus.Histogram
	creates          *prometheus.CounterVec
	expired          prometheus.Counter
	forks            prometheus.Counter
	forkPauseSeconds prometheus.Histogram
	snapshots        prometheus.Counter
	pauses           prometheus.Counter
}

var latencyBuckets = []float64{.025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "panda_sandbox_create_seconds", Help: "Time to create a sandbox until its guest agent answers.", Buckets: latencyBuckets}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "panda_sandbox_creates_total", Help: "Sandbox creates by result."}, []string{"result"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "panda_sandbox_expired_total", Help: "Sandboxes stopped because their TTL ran out."}),
		forks: prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_forks_total", Help: "Fork requests that captured their parent."}),
		forkPauseSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "panda_fork_parent_pause_seconds", Help: "How long a fork kept its parent's vCPUs stopped.",
			Buckets: []float64{.005, .01, .025, .05, .075, .1, .15, .25, .5, 1}}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_snapshots_total", Help: "Snapshots taken."}),
		pauses:    prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_pauses_total", Help: "Sandboxes paused."}),
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{m.createSeconds, m.creates, m.expired, m.forks, m.forkPauseSeconds, m.snapshots, m.pauses} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("control metrics: %w", err)
		}
	}
	for _, r := range []string{"ok", "error"} {
		m.creates.WithLabelValues(r)
	}
	return m, nil
}

func (p *Plane) storeDownAfter() time.Duration {
	if p.cfg.StoreDownAfter > 0 {
		return p.cfg.StoreDownAfter
	}
	return storeDownAfter
}

// now is the time by the plane's clock, in UTC (as records hold it).
func (p *Plane) now() time.Time { return p.clock().UTC() }

// clock is the time by the plane's clock; the system's keeps its monotonic
// reading, which intervals of the TTL loop are measured with.
func (p *Plane) clock() time.Time {
	if p.cfg.Now != nil {
		return p.cfg.Now()
	}
	return time.Now()
}

// Config is the plane's configuration, its defaults filled in.
func (p *Plane) Config() Config { return p.cfg }

// Events is the hub the plane publishes its record changes to
// (Config.Events).
func (p *Plane) Events() *events.Hub { return p.cfg.Events }

// OnGone adds f to those told when a sandbox's guest goes away (it
// stopped or paused; Config.Gone), so that connections to it are closed.
// f must not block.
func (p *Plane) OnGone(f func(id string)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.goneFns = append(p.goneFns, f)
}

// gone tells Config.Gone and OnGone's that sandbox id's guest went away.
func (p *Plane) gone(id string) {
	if p.cfg.Gone != nil {
		p.cfg.Gone(id)
	}
	p.mu.Lock()
	fns := p.goneFns
	p.mu.Unlock()
	for _, f := range fns {
		f(id)
	}
}
