// Package agent is the host agent: it owns the sandboxes of one host, from
// restore to kill. It keeps templates baked (package template), gives each
// sandbox a reflink clone of its template's disk and a copy-on-write mapping
// of its template's memory (package volume, package vmm), talks to the guest
// agent in each sandbox (package guestproto), notices VMMs that die, and
// re-adopts the VMMs of an earlier run after a restart. It keeps no durable
// catalog: each sandbox's directory describes it (sandbox.json), and the
// control plane's catalog is reconciled against Recover.
package hostagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"
)

// Errors: the host contract's classes (package host), named here as the
// agent always has.
var (
	ErrNotFound = host.ErrNotFound
	ErrConflict = host.ErrConflict
	ErrInvalid  = host.ErrInvalid
	ErrNoSpace  = host.ErrNoSpace
	ErrCorrupt  = host.ErrCorrupt
	ErrNotReady = host.ErrNotReady
)

// Config configures an Agent.
type Config struct {
	// DataDir holds everything the agent keeps: the store volume
	// (templates, sandboxes) and run directories.
	DataDir string
	// ImagesDir holds the outputs of `make setup` (default DataDir/images).
	ImagesDir string
	// RunDir holds per-sandbox sockets (default DataDir/run). Keep it
	// short: unix socket paths are limited to 108 bytes.
	RunDir string
	// Accel is auto (probe KVM once, cache the answer), kvm or tcg.
	Accel accel.Accel
	// Driver starts and adopts the sandboxes' VMMs and bakes' (required;
	// qemu.New in production). The agent does not close it.
	Driver vmm.Driver
	// VolumeSize is the size of the XFS image made when DataDir cannot
	// reflink (0: automatic).
	VolumeSize int64
	// AdoptMount: see volume.Options.AdoptMount.
	AdoptMount bool
	// MinFreeBytes is the free space below which creates fail with
	// ErrNoSpace (default 256 MiB).
	MinFreeBytes int64
	// MaxConcurrentStarts bounds the VMMs being restored at once (creates,
	// fork children, resumes); more wait their turn, so that a burst of
	// creates queues instead of thrashing the CPUs until restores time out
	// (default 2 per CPU, at least 4).
	MaxConcurrentStarts int
	// DefaultTemplate, DefaultMemoryMiB and DefaultVCPUs fill in create
	// requests that leave them out.
	DefaultTemplate  string
	DefaultMemoryMiB int
	DefaultVCPUs     int
	// OnExit, if set, is called (from its own goroutine) when a sandbox's
	// VMM exits without being killed through the agent.
	OnExit func(id string, err error)
	// Dial, if set, opens a TCP connection to port of the guest of sandbox
	// id, which is running (DialGuest checks that first): the sandbox
	// network's dialer. Its errors are returned wrapped: a refused
	// connection must match syscall.ECONNREFUSED and a timeout
	// context.DeadlineExceeded (errors.Is), as net.Dialer's do. Nil: the
	// host has no sandbox networking (DialGuest fails with
	// errors.ErrUnsupported).
	Dial func(ctx context.Context, id string, port int) (net.Conn, error)
	// Network, if set, gives every sandbox a network namespace of its own
	// joined to the host, with the sandbox's egress policy, DNS and NAT
	// (its owner runs, detaches and closes it); DialGuest then dials
	// through it unless Dial is set. Nil: every sandbox's guest reaches
	// its gateway and nothing beyond (guestnet.Isolated).
	Network *network.Manager
	// BakeNetwork, with Network, lets bakes reach the network under this
	// policy (a template's set-up may install packages); nil: bakes get
	// an isolated namespace with no way out.
	BakeNetwork *netpolicy.Policy
	// Store, if set, keeps snapshots and paused sandboxes durable in an
	// object store shared with other hosts: each new snapshot and each
	// pause is uploaded in the background; a create from a snapshot whose
	// files this host lost, or never had, downloads it (store.go), and so
	// does a resume of a paused sandbox this host does not hold
	// (paused.go). Nil: both live only on this host's disk. The agent
	// does not close it.
	Store *chunkstore.Store
	// StoreRetry is the wait after a failed upload or store delete before
	// the next attempt, doubling up to 32 times this (default 2 s).
	StoreRetry time.Duration
	// Lazy, if set (with Store), restores snapshots and paused sandboxes
	// this host does not hold with their memory paged in on first touch
	// instead of downloaded first (lazy.go, docs/lazy-restore.md).
	Lazy   *LazyConfig
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ImagesDir == "" {
		c.ImagesDir = filepath.Join(c.DataDir, "images")
	}
	if c.RunDir == "" {
		c.RunDir = filepath.Join(c.DataDir, "run")
	}
	if c.Accel == "" {
		c.Accel = accel.Auto
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = 256 << 20
	}
	if c.MaxConcurrentStarts == 0 {
		c.MaxConcurrentStarts = max(4, 2*runtime.NumCPU())
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "base"
	}
	if c.DefaultMemoryMiB == 0 {
		c.DefaultMemoryMiB = 1024
	}
	if c.DefaultVCPUs == 0 {
		c.DefaultVCPUs = 1
	}
	if c.StoreRetry == 0 {
		c.StoreRetry = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Agent manages the sandboxes of this host. Safe for concurrent use.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	vol       *volume.Volume
	driver    vmm.Driver
	accel     accel.Accel
	templates *template.Store
	images    template.Images
	sbDir     string

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	closed    bool
	gidMu     sync.Mutex
	gids      map[string]uint32 // tenant group ids (tenantGID)

	// starts is the semaphore of MaxConcurrentStarts.
	starts chan struct{}
	// verified maps a snapshot to the fingerprint its files had when they
	// last passed their checksums: unchanged files need no new check.
	verified map[string]string

	// store keeps snapshots in the object store (Config.Store; nil: none),
	// with its background jobs (store.go).
	store *chunkstore.Store
	storeJobs
	lazyState
	// replicas runs one download at a time of each user template version
	// built on another host (usertemplates.go).
	replicas singleflight.Group
}

// Open prepares the host: opens (and if needed mounts) the store volume,
// resolves the accelerator, and opens the template store. It starts no
// goroutines and no VMs.
func Open(ctx context.Context, cfg Config) (*Agent, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("open host agent: %w: data directory not set", ErrInvalid)
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, sandboxes: map[string]*sandbox{}, verified: map[string]string{}, gids: map[string]uint32{}, starts: make(chan struct{}, cfg.MaxConcurrentStarts), images: template.Images{Dir: cfg.ImagesDir}, store: cfg.Store}
	a.jobs, a.storeErrs = map[string]*job{}, map[string]string{}
	a.bgCtx, a.bgCancel = context.WithCancel(context.Background())
	if _, err := os.Stat(a.images.Kernel()); err != nil {
		return nil, fmt.Errorf("open host agent: guest kernel missing: %w (run make setup)", err)
	}
	if cfg.Driver == nil {
		return nil, fmt.Errorf("open host agent: %w: no vmm driver", ErrInvalid)
	}
	drv := cfg.Driver
	a.driver = drv
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("open host agent: %w", err)
	}
	acc, why, err := drv.ResolveAccel(ctx, cfg.Accel, a.images.Kernel(), filepath.Join(cfg.DataDir, "accel.cache"))
	if err != nil {
		return nil, fmt.Errorf("open host agent: %w", err)
	}
	a.accel = acc
	a.log.Info("accelerator", "accel", acc, "why", why)
	vol, err := volume.Open(ctx, cfg.DataDir, volume.Options{ImageSize: cfg.VolumeSize, AdoptMount: cfg.AdoptMount, Logger: cfg.Logger})
	if err != nil {
		return nil, fmt.Errorf("open host agent: %w", err)
	}
	a.vol = vol
	a.sbDir = filepath.Join(vol.Dir, "sandboxes")
	var remote template.Remote
	if a.store != nil {
		remote = templateRemote{a}
	}
	ts, err := template.NewStore(template.Config{
		Dir:     filepath.Join(vol.Dir, "templates"),
		RunDir:  cfg.RunDir,
		Images:  a.images,
		UserDir: filepath.Join(vol.Dir, "rootfs"),
		Driver:  drv,
		Accel:   acc,
		TSCkHz:  drv.TSCkHz(),
		Net:     a.bakeNIC(),
		Remote:  remote,
		Logger:  cfg.Logger,
	})
	if err != nil {
		vol.Close()
		return nil, fmt.Errorf("open host agent: %w", err)
	}
	a.templates = ts
	for _, d := range []string{a.sbDir, filepath.Join(vol.Dir, "forks"), filepath.Join(vol.Dir, "snapshots"), filepath.Join(vol.Dir, "tenants"), filepath.Join(vol.Dir, storedDir), filepath.Join(vol.Dir, storedDir, pausedRecordDir), filepath.Join(vol.Dir, fetchDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			vol.Close()
			return nil, fmt.Errorf("open host agent: %w", err)
		}
	}
	return a, nil
}

// Accel is the accelerator sandboxes run with.
func (a *Agent) Accel() accel.Accel { return a.accel }

// NetworkOff reports that the agent runs without sandbox networking
// (Config.Network nil): each guest gets an isolated interface only.
func (a *Agent) NetworkOff() bool { return a.cfg.Network == nil }

// StoreDir is the reflink volume's directory.
func (a *Agent) StoreDir() string { return a.vol.Dir }

// Templates exposes the template store.
func (a *Agent) Templates() *template.Store { return a.templates }

// TemplateParams fills in defaults for a template request.
func (a *Agent) TemplateParams(name string, memoryMiB, vcpus int) templates.Params {
	if name == "" {
		name = a.cfg.DefaultTemplate
	}
	if memoryMiB == 0 {
		memoryMiB = a.cfg.DefaultMemoryMiB
	}
	if vcpus == 0 {
		vcpus = a.cfg.DefaultVCPUs
	}
	return templates.Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
}

// State of a sandbox: the lifecycle package's.
type State = lifecycle.State

// The states, named as this package always has.
const (
	StateStarting = lifecycle.Starting
	StateRunning  = lifecycle.Running
	StatePausing  = lifecycle.Pausing
	StatePaused   = lifecycle.Paused
	StateResuming = lifecycle.Resuming
	StateStopping = lifecycle.Stopping
	StateStopped  = lifecycle.Stopped
)

// Info describes a sandbox: the host contract's.
type Info = host.Info

// record is what sandbox.json holds: enough to adopt the VMM again, or to
// finish or roll back the operation a crash interrupted (Op).
type record struct {
	ID       string `json:"id"`
	Template string `json:"template"`
	State    State  `json:"state"`
	// Op is the operation in flight that recovery must finish or roll
	// back: opPause or opResume ("" for none).
	Op       string `json:"op,omitempty"`
	Owner    string `json:"owner,omitempty"`
	ParentID string `json:"parent_id,omitempty"`
	Snapshot string `json:"snapshot_id,omitempty"`
	// Lineage is the durable snapshot the sandbox derives from: the one
	// it was created from, or that one's lineage if it was a transient
	// capture (a cross-host fork's), or its parent's for a fork child;
	// "" for its template (lineage.go).
	Lineage   string            `json:"lineage,omitempty"`
	Spec      vmm.Spec          `json:"spec"`
	Hostname  string            `json:"hostname"`
	MachineID string            `json:"machine_id"`
	Env       map[string]string `json:"env,omitempty"`
	// Cwd is the working directory of execs that name none ("" for the
	// guest's default): the WORKDIR of a user template's image.
	Cwd string `json:"cwd,omitempty"`
	// User is the user of execs that name none ("" for root): the USER of a
	// user template's image.
	User      string    `json:"user,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// Network is the sandbox's egress policy; NetNS the network namespace
	// it runs in (while it has a VMM), to adopt after a restart.
	Network netpolicy.Policy `json:"network"`
	NetNS   string           `json:"netns,omitempty"`
	// PauseID names the pause capture of a paused sandbox (new at each
	// pause, "" once resumed): its set paused/<id> in the object store
	// carries it, so that a host deletes that set only while it holds the
	// capture this host made or adopted, never a later pause's (paused.go).
	PauseID string `json:"pause_id,omitempty"`
}

// Operations recorded in record.Op.
const (
	opPause  = "pause"
	opResume = "resume"
)

func (s *sandbox) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	pid := 0
	if s.m != nil {
		pid = s.m.PID()
	}
	return Info{
		ID: s.rec.ID, Template: s.rec.Template, MemoryMiB: s.rec.Spec.MemoryMiB, VCPUs: s.rec.Spec.VCPUs,
		State: s.state, CreatedAt: s.rec.CreatedAt, PID: pid, Hostname: s.rec.Hostname,
		ParentID: s.rec.ParentID, Snapshot: s.rec.Snapshot, Busy: len(s.slot) > 0,
		FetchedBytes: s.fetched,
	}
}

// setFetched records what was read from the object store to start s as
// it runs now (Info.FetchedBytes).
func (s *sandbox) setFetched(n int64) {
	s.mu.Lock()
	s.fetched = n
	s.mu.Unlock()
}

// CreateRequest asks for a new sandbox: the host contract's.
type CreateRequest = host.CreateRequest

// checkCreate checks a create's ID (giving it one if it has none) and
// owner.
func checkCreate(req *CreateRequest) error {
	if req.ID == "" {
		req.ID = host.NewID()
	} else if !host.ValidID(req.ID) {
		return fmt.Errorf("create sandbox: %w: id %q must be lowercase letters and digits", ErrInvalid, req.ID)
	}
	if req.Owner != "" && !validOwner(req.Owner) {
		return fmt.Errorf("create sandbox: %w: owner %q", ErrInvalid, req.Owner)
	}
	return nil
}

// Create restores a new sandbox from a template and returns once its guest
// agent has answered (clock set, RNG reseeded, identity written).
func (a *Agent) Create(ctx context.Context, req CreateRequest) (Info, error) {
	if err := checkCreate(&req); err != nil {
		return Info{}, err
	}
	var im image
	var fetched chunkstore.DownloadStats // what this create downloaded
	if req.SnapshotID != "" {
		snap, err := a.GetSnapshot(req.SnapshotID)
		if errors.Is(err, ErrNotFound) && a.store != nil {
			// Taken on another host sharing the store?
			snap, fetched, err = a.adoptSnapshot(ctx, req.SnapshotID)
		}
		if err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		if _, err := os.Stat(a.snapshotDir(snap.ID)); errors.Is(err, os.ErrNotExist) && a.store != nil {
			// Durable in the store, lost here: fetch it first.
			if fetched, err = a.fetchSnapshot(ctx, snap.ID, nil); err != nil {
				return Info{}, fmt.Errorf("create sandbox: %w", err)
			}
		}
		if err := a.verifySnapshot(snap); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		im = a.snapshotImage(snap)
	} else {
		if err := a.replicateUserTemplate(ctx, req.Template, req.Progress); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		p := a.TemplateParams(req.Template, req.MemoryMiB, req.VCPUs)
		if err := p.Validate(); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrInvalid, err)
		}
		tmpl, err := a.templates.Get(ctx, p, req.Progress)
		if err != nil {
			if errors.Is(err, templates.ErrNotFound) {
				return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrNotFound, err)
			}
			if errors.Is(err, templates.ErrInvalid) {
				return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrInvalid, err)
			}
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		im = templateImage(tmpl, a.images)
		if req.Owner != "" {
			mem, err := a.tenantMemory(tmpl, req.Owner)
			if err != nil {
				return Info{}, fmt.Errorf("create sandbox: %w", err)
			}
			im.memFile = mem
		}
	}
	return a.createFrom(ctx, req, im, fetched)
}

// createFrom registers sandbox req and starts it from im (Create's end);
// fetched is what was downloaded to make im.
func (a *Agent) createFrom(ctx context.Context, req CreateRequest, im image, fetched chunkstore.DownloadStats) (Info, error) {
	if err := a.checkSpace(); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := req.Network.Validate(); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w: %w", ErrInvalid, err)
	}
	env, cwd, user := a.imageDefaults(req.Template, req.Env)
	s, err := a.register(record{ID: req.ID, Env: env, Cwd: cwd, User: user, Owner: req.Owner, Snapshot: req.SnapshotID, Lineage: im.lineage, Network: req.Network})
	if err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	s.setFetched(fetched.BytesFetched)
	if err := a.start(ctx, s, im); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	return s.info(), nil
}

// imageDefaults returns the default environment, working directory and
// user of the execs of a sandbox of template name with create-time env: for
// a user template, its image's Env under env (a variable of env wins), its
// WorkingDir and its User; otherwise env, "" and "" (root). A User the
// guest protocol cannot carry is dropped (the execs run as root, as they
// did before users were applied) rather than failing every exec.
func (a *Agent) imageDefaults(name string, env map[string]string) (map[string]string, string, string) {
	if name == "" || a.templates.IsBuiltin(name) {
		return env, "", ""
	}
	u, err := a.templates.UserRootFS(name)
	if err != nil {
		return env, "", ""
	}
	user := u.Image.User
	if err := guestproto.ValidateUser(user); err != nil {
		a.log.Warn("image user ignored", "template", name, "user", user, "err", err)
		user = ""
	}
	out := u.Image.EnvMap()
	if out == nil {
		return env, u.Image.WorkingDir, user
	}
	for k, v := range env {
		out[k] = v
	}
	return out, u.Image.WorkingDir, user
}

// start restores a registered (starting) sandbox from im and makes it
// running; on failure, or if it is killed meanwhile, it is stopped and its
// files are gone.
func (a *Agent) start(ctx context.Context, s *sandbox, im image) error {
	ctx, end, err := s.begin(ctx, "start", StateStarting)
	if err != nil {
		a.stop(s)
		return err
	}
	err = a.restore(ctx, s, im)
	if err == nil {
		err = s.transition(lifecycle.Started)
	}
	if err == nil {
		err = classifyIOError(s.writeRecord(false))
	}
	end()
	if err != nil {
		killed := s.stopping()
		a.stop(s)
		if killed {
			return errStopped(s, "start")
		}
		return err
	}
	return nil
}

// tenantMemory returns owner's copy of tmpl's memory image, making it on
// first use: a reflink clone (O(metadata) on disk) that does not share page
// cache with the original, so pages are shared copy-on-write only among
// one owner's sandboxes. Copies are keyed by the template's boot id: a
// re-bake gets new copies, and tenantGC removes the old ones.
func (a *Agent) tenantMemory(tmpl *template.Template, owner string) (string, error) {
	dir := filepath.Join(a.vol.Dir, "tenants", owner)
	path := filepath.Join(dir, tmpl.Key()+"-"+tmpl.BootID+".mem")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", classifyIOError(err)
	}
	tmp := fmt.Sprintf("%s.tmp-%s", path, randHex(4))
	if err := volume.Clone(tmpl.MemFile(), tmp); err != nil {
		return "", classifyIOError(fmt.Errorf("copy template memory for %s: %w", owner, err))
	}
	if err := os.Rename(tmp, path); err != nil { // concurrent creates: either copy is fine
		os.Remove(tmp)
		return "", fmt.Errorf("copy template memory for %s: %w", owner, err)
	}
	return path, nil
}

// Tenant group ids: each owner's VMMs run with a group of their own, the
// group of that owner's shared memory images (see vmm.Spec.GID), so that
// the VMM of one tenant cannot open another tenant's images. Allocated
// from tenantGIDBase up, recorded in the owner's tenant directory.
const (
	tenantGIDBase  = 1_400_000_000
	tenantGIDCount = 1_000_000
)

// tenantGID returns owner's group id, allocating it on first use ("" is
// the driver's default group).
func (a *Agent) tenantGID(owner string) (uint32, error) {
	if owner == "" {
		return 0, nil
	}
	a.gidMu.Lock()
	defer a.gidMu.Unlock()
	if gid, ok := a.gids[owner]; ok {
		return gid, nil
	}
	dir := filepath.Join(a.vol.Dir, "tenants", owner)
	file := filepath.Join(dir, "gid")
	if b, err := os.ReadFile(file); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil {
			a.gids[owner] = uint32(v)
			return uint32(v), nil
		}
	}
	// The next free one: one more than the largest recorded.
	next := uint32(tenantGIDBase)
	files, _ := filepath.Glob(filepath.Join(a.vol.Dir, "tenants", "*", "gid"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil && uint32(v) >= next {
				next = uint32(v) + 1
			}
		}
	}
	if next >= tenantGIDBase+tenantGIDCount {
		return 0, fmt.Errorf("%w: no tenant group id left", vmm.ErrExhausted)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, classifyIOError(err)
	}
	if err := manifest.WriteFile(file, []byte(strconv.FormatUint(uint64(next), 10)+"\n"), 0o600); err != nil {
		return 0, classifyIOError(err)
	}
	a.gids[owner] = next
	return next, nil
}

func validOwner(owner string) bool {
	if owner == "" || len(owner) > 64 {
		return false
	}
	for _, c := range owner {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// tenantGC removes tenants' copies of template memory images whose bake is
// gone. Running sandboxes are unaffected: they hold hard links.
func (a *Agent) tenantGC() {
	current := map[string]bool{}
	if list, err := a.templates.List(); err == nil {
		for _, t := range list {
			current[t.Key()+"-"+t.BootID+".mem"] = true
		}
	}
	files, _ := filepath.Glob(filepath.Join(a.vol.Dir, "tenants", "*", "*"))
	for _, f := range files {
		if !current[filepath.Base(f)] {
			os.Remove(f)
		}
	}
}

// register reserves rec.ID for a new sandbox in state starting.
func (a *Agent) register(rec record) (*sandbox, error) {
	rec.Hostname = rec.ID
	rec.MachineID = randHex(16)
	rec.CreatedAt = time.Now().UTC()
	s := newSandbox(rec, filepath.Join(a.sbDir, rec.ID), filepath.Join(a.cfg.RunDir, rec.ID), StateStarting)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("%w: host agent is shutting down", ErrConflict)
	}
	if _, dup := a.sandboxes[rec.ID]; dup {
		return nil, fmt.Errorf("%w: id %s in use", ErrConflict, rec.ID)
	}
	a.sandboxes[rec.ID] = s
	return s, nil
}

// checkSpace fails with ErrNoSpace when the store is nearly full. The
// message is for users: it names no host path (the log does).
func (a *Agent) checkSpace() error {
	var st unix.Statfs_t
	if err := unix.Statfs(a.vol.Dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", a.vol.Dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free < a.cfg.MinFreeBytes {
		a.log.Warn("store nearly full", "dir", a.vol.Dir, "free_mib", free>>20, "min_free_mib", a.cfg.MinFreeBytes>>20)
		return fmt.Errorf("%w: the host has %d MiB free for sandboxes and needs at least %d MiB; kill sandboxes or delete snapshots",
			ErrNoSpace, free>>20, a.cfg.MinFreeBytes>>20)
	}
	return nil
}

// image is a saved machine that sandboxes are restored from: a template,
// a snapshot, a fork's capture or a paused sandbox's capture. Dir holds
// vm.mem, vm.state and rootfs.ext4; Spec is the machine shape they were
// saved with (per-machine paths are filled in at restore).
type image struct {
	Dir      string
	Spec     vmm.Spec
	Template string // template key, for the record
	// memFile, if set, replaces Dir/vm.mem (a tenant's copy of a
	// template's memory image).
	memFile string
	// fullCopy gives the sandbox a full private copy of its memory (every
	// page copied into the VMM at start, shared with nobody): the naive
	// baseline that `panda bench fork` compares against. Nothing else
	// uses it.
	fullCopy bool
	// lineage is the durable snapshot a sandbox restored from im derives
	// from (record.Lineage).
	lineage string
	// arrival, if set, is a snapshot still being received (Dir unused):
	// restore takes its files from where the receive has them once its
	// disk is in, and loads the machine once all of it is
	// (ReceiveAndCreate).
	arrival *arrival
}

func (im image) mem() string {
	if im.memFile != "" {
		return im.memFile
	}
	return filepath.Join(im.Dir, "vm.mem")
}
func (im image) state() string  { return filepath.Join(im.Dir, "vm.state") }
func (im image) rootfs() string { return filepath.Join(im.Dir, "rootfs.ext4") }

func templateImage(t *template.Template, images template.Images) image {
	return image{Dir: t.Dir, Spec: t.Spec(images), Template: t.Key()}
}

// restoreTimeout bounds one restore, from files to the guest's answer.
const restoreTimeout = 90 * time.Second

// The files of a sandbox's running machine, in its directory.
const (
	diskFile  = "rootfs.ext4"
	memFile   = "vm.mem"
	stateFile = "vm.state"
)

// restore gives s its own files from im and starts its VMM: the disk is a
// reflink clone, the memory image and device state are hard links, so im
// stays intact (a paused sandbox's capture survives a failed resume) and
// may be deleted later. On failure everything restore made is undone; s's
// state is the caller's to change.
func (a *Agent) restore(ctx context.Context, s *sandbox, im image) (err error) {
	// Wait for a start slot (bounded by ctx only): the restore's own
	// deadline counts from when it may run.
	select {
	case a.starts <- struct{}{}:
		defer func() { <-a.starts }()
	case <-ctx.Done():
		return fmt.Errorf("waiting for a start slot: %w", ctx.Err())
	}
	// Bounded: a VMM that never answers must not leave the sandbox starting.
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			a.undoRestore(s)
		}
	}()
	t0 := time.Now()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return classifyIOError(err)
	}
	if err := os.MkdirAll(s.runDir, 0o700); err != nil {
		return err
	}
	disk, mem, state := filepath.Join(s.dir, diskFile), filepath.Join(s.dir, memFile), filepath.Join(s.dir, stateFile)
	for _, f := range []string{disk, mem, state} {
		os.Remove(f) // a leftover of an interrupted restore
	}
	if im.arrival == nil {
		err = restoreFiles(im, disk, mem, state)
	} else if err = im.arrival.waitDisk(ctx); err == nil {
		// The memory image and device state are linked while they
		// arrive: the same inodes, written on.
		err = im.arrival.withDir(func(dir string) error {
			im.Dir = dir
			return restoreFiles(im, disk, mem, state)
		})
	}
	if err != nil {
		return err
	}
	spec := im.Spec
	spec.MemoryFile = mem
	spec.MemoryShared = false
	spec.Incoming = true
	spec.Disk = disk
	spec.RunDir = s.runDir
	spec.ConsoleLog = ""
	spec.Prealloc = im.fullCopy
	if spec.GID, err = a.tenantGID(s.rec.Owner); err != nil {
		return err
	}
	var tap *os.File
	if spec.Net != nil {
		// Saved with a network interface (every template since guests
		// have one): the machine needs a TAP, and the record names its
		// namespace before the VMM starts. The VMM keeps its own copy.
		if tap, err = a.nic(ctx, s); err != nil {
			return err
		}
		defer tap.Close()
	}
	s.mu.Lock()
	s.rec.Spec = spec
	s.rec.Template = im.Template
	s.mu.Unlock()
	if err := s.writeRecord(false); err != nil {
		return classifyIOError(err)
	}
	tFiles := time.Since(t0)
	if tap != nil {
		spec.Net = &vmm.Net{TAP: tap, MAC: spec.Net.MAC} // never modify the image's Net
	}
	m, err := a.driver.Start(ctx, spec)
	if err != nil {
		return err
	}
	s.setMachine(m, nil, nil)
	tStart := time.Since(t0)
	// Connect before loading: the guest then never sees the host side of
	// its serial port go away across the restore.
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
	if err != nil {
		return fmt.Errorf("connect to guest agent: %w", err)
	}
	client := s.newClient(conn)
	ready := make(chan struct{})
	s.setMachine(m, client, ready)
	if s.stopping() { // killed before it could see the machine
		return errStopped(s, "restore")
	}
	if im.arrival != nil {
		// The VMM started while the memory image arrived; nothing
		// of it runs before all of it is in.
		if err := im.arrival.wait(ctx); err != nil {
			return fmt.Errorf("receive the snapshot: %w", err)
		}
	}
	tArrived := time.Since(t0)
	if err := m.LoadState(ctx, state); err != nil {
		return err
	}
	tLoad := time.Since(t0)
	if err := m.Resume(ctx); err != nil {
		return err
	}
	tResume := time.Since(t0)
	if err := a.hello(ctx, s, client); err != nil {
		return err
	}
	close(ready)
	go a.watch(s, m)
	go a.keepGuest(s, m, client)
	a.log.Debug("sandbox restored", "sandbox_id", s.rec.ID, "files_ms", ms(tFiles), "vmm_ms", ms(tStart), "arrived_ms", ms(tArrived),
		"load_ms", ms(tLoad), "resume_ms", ms(tResume), "ready_ms", ms(time.Since(t0)))
	return nil
}

// restoreFiles gives a sandbox its files from im: disk, mem and state
// (paths in its directory). The disk is a reflink clone; the memory image
// and device state are hard links, which keep the same inode, hence the
// same page cache as every other sandbox restored from im, and survive
// im's deletion.
func restoreFiles(im image, disk, mem, state string) error {
	if err := volume.Clone(im.rootfs(), disk); err != nil {
		return classifyIOError(err)
	}
	if err := os.Link(im.mem(), mem); err != nil {
		return classifyIOError(fmt.Errorf("link memory image: %w", err))
	}
	if err := os.Link(im.state(), state); err != nil {
		return classifyIOError(fmt.Errorf("link device state: %w", err))
	}
	return nil
}

// undoRestore kills the VMM a failed restore started and removes the
// files it made (the sandbox's directory and record stay).
func (a *Agent) undoRestore(s *sandbox) {
	s.mu.Lock()
	m, client := s.m, s.client
	s.m, s.client, s.ready = nil, nil, nil // the watcher ignores a VMM that is no longer s.m
	s.mu.Unlock()
	if client != nil {
		client.Close()
	}
	if m != nil {
		m.Kill()
	}
	a.releaseNet(s)
	a.removeLiveFiles(s)
}

// removeLiveFiles removes the files of s's machine (not its record or
// pause capture) and its run directory.
func (a *Agent) removeLiveFiles(s *sandbox) {
	for _, f := range []string{diskFile, memFile, stateFile} {
		os.Remove(filepath.Join(s.dir, f))
	}
	os.RemoveAll(s.runDir)
}

// helloTimeout bounds the guest's answer to HELLO.
const helloTimeout = 30 * time.Second

func (a *Agent) hello(ctx context.Context, s *sandbox, client *guestproto.Client) error {
	ctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	s.mu.Lock()
	req := guestproto.HelloRequest{Hostname: s.rec.Hostname, MachineID: s.rec.MachineID, SandboxID: s.rec.ID, Env: s.rec.Env}
	s.mu.Unlock()
	reply, err := client.Hello(ctx, req)
	if err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	for _, e := range reply.HookErrors {
		a.log.Warn("guest restore hook failed", "sandbox_id", s.rec.ID, "err", e)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// watch waits for the VMM to exit. An exit the agent did not cause stops
// the sandbox and is reported through Config.OnExit.
func (a *Agent) watch(s *sandbox, m vmm.Machine) {
	<-m.Done()
	if s.getState() == StatePausing {
		// A pause is capturing the machine: its outcome decides. A
		// complete capture makes the sandbox paused (the pause stops the
		// VMM anyway, and it is no longer s.m); an incomplete one fails
		// the pause, and the sandbox, running without a VMM, is stopped
		// below. Stopping it now would delete a capture the pause is
		// about to report done.
		select {
		case s.slot <- struct{}{}:
			<-s.slot
		case <-s.gone:
		}
	}
	s.mu.Lock()
	// Killed by us, replaced (pause, a failed resume) or left to the next
	// agent (Detach).
	ours := s.m != m || s.detached || s.state == StateStopping || s.state == StateStopped
	s.mu.Unlock()
	if ours {
		return
	}
	err := m.ExitError()
	a.log.Warn("sandbox vmm exited", "sandbox_id", s.rec.ID, "err", err)
	a.stop(s)
	if a.cfg.OnExit != nil {
		a.cfg.OnExit(s.rec.ID, err)
	}
}

func (a *Agent) get(id string) (*sandbox, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	return s, nil
}

// Get describes one sandbox.
func (a *Agent) Get(id string) (Info, error) {
	s, err := a.get(id)
	if err != nil {
		return Info{}, err
	}
	return a.info(s), nil
}

// info is s.info with where a paused sandbox is stored.
func (a *Agent) info(s *sandbox) Info {
	in := s.info()
	if in.State != StatePaused {
		return in
	}
	if a.store == nil {
		in.Stored = host.StoredLocal
		return in
	}
	s.mu.Lock()
	durable := s.rec.PauseID != "" && s.durablePause == s.rec.PauseID
	s.mu.Unlock()
	if durable {
		in.Stored = host.StoredDurable
		if r, ok := a.pausedRecord(s.id(), s.pauseID()); ok {
			in.UploadedBytes = r.Upload.BytesUploaded
		}
	} else {
		in.Stored = host.StoredUploading
		in.StoreError = a.storeError(pausedName(s.rec.ID))
	}
	return in
}

// List describes every sandbox, oldest first.
func (a *Agent) List() []Info {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	out := make([]Info, 0, len(all))
	for _, s := range all {
		out = append(out, a.info(s))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// Kill stops a sandbox and removes its files, whatever it is doing: an
// operation in flight is cancelled, and Kill returns within seconds even if
// the guest or the VMM does not answer. Killing an unknown sandbox is
// ErrNotFound. With an object store, a paused sandbox's capture is removed
// from the store too (tombstoned first, then deleted in the background),
// and killing a sandbox this host does not hold removes its paused capture
// from the store if the store has one (its host was lost): ErrNotFound
// only if it has none, host.ErrUnavailable if the store cannot be reached.
func (a *Agent) Kill(ctx context.Context, id string) error {
	s, err := a.get(id)
	if errors.Is(err, ErrNotFound) && a.store != nil {
		return a.killInStore(ctx, id)
	}
	if err != nil {
		return err
	}
	pid := ""
	if a.store != nil {
		if pid = s.pauseID(); pid != "" {
			if err := a.tombstonePaused(id, pid); err != nil {
				// Killed all the same (a full disk must not keep a
				// sandbox from being killed); the store's copy is
				// deleted below, but a crash now would leave it.
				a.log.Error("record a killed sandbox's capture stale", "sandbox_id", id, "err", err)
			}
		}
	}
	a.stop(s)
	if pid != "" {
		a.startPausedDelete(id, pid)
	}
	return nil
}

// Guest returns the guest agent client of a running sandbox: ErrConflict
// if it is not running, ErrNotReady if it was adopted after a restart and
// its guest has not answered yet.
func (a *Agent) Guest(id string) (*guestproto.Client, error) {
	s, err := a.get(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateRunning || s.client == nil {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, s.state, ErrConflict)
	}
	select {
	case <-s.ready:
	default:
		return nil, fmt.Errorf("sandbox %s: %w", id, ErrNotReady)
	}
	return s.client, nil
}

// DialGuest opens a TCP connection to port (1-65535) of the guest of the
// running sandbox id, through Config.Dial. The connection is the caller's
// to close; it is not closed when the sandbox stops (the sandbox's network
// going away ends it). Errors: ErrInvalid (port out of range), ErrNotFound
// (no such sandbox), ErrConflict (not running), errors.ErrUnsupported (no
// Config.Dial), else Config.Dial's: syscall.ECONNREFUSED when nothing
// listens on the port, context.DeadlineExceeded on a timeout. Safe for
// concurrent use.
func (a *Agent) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial sandbox %s: %w: port %d is not between 1 and 65535", id, ErrInvalid, port)
	}
	s, err := a.get(id)
	if err != nil {
		return nil, err
	}
	if st := s.getState(); st != StateRunning {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, st, ErrConflict)
	}
	dial := a.cfg.Dial
	if dial == nil && a.cfg.Network != nil {
		dial = func(ctx context.Context, _ string, port int) (net.Conn, error) { return dialNet(ctx, s, port) }
	}
	if dial == nil {
		return nil, fmt.Errorf("dial sandbox %s: this host has no sandbox networking: %w", id, errors.ErrUnsupported)
	}
	c, err := dial(ctx, id, port)
	if err != nil {
		return nil, fmt.Errorf("dial port %d of sandbox %s: %w", port, id, err)
	}
	return c, nil
}

// Exec runs a command in a sandbox; see guestproto.Client.Exec.
func (a *Agent) Exec(ctx context.Context, id string, req guestproto.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (guestproto.ExecResult, error) {
	c, err := a.Guest(id)
	if err != nil {
		return guestproto.ExecResult{}, err
	}
	return c.Exec(ctx, req, stdin, stdout, stderr)
}

// closeWait bounds how long Close and Detach wait for operations in flight
// (a pause finishing its capture) before cancelling them.
const closeWait = 60 * time.Second

// quiesce stops new operations and waits for those in flight on every
// sandbox (cancelling them after closeWait); it returns the sandboxes.
func (a *Agent) quiesce() []*sandbox {
	a.mu.Lock()
	a.closed = true
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	deadline := time.After(closeWait)
	for _, s := range all {
		select {
		case s.slot <- struct{}{}:
			<-s.slot
		case <-s.gone:
		case <-deadline:
			s.mu.Lock()
			if s.opCancel != nil {
				s.opCancel()
			}
			s.mu.Unlock()
			select {
			case s.slot <- struct{}{}:
				<-s.slot
			case <-s.gone:
			}
		}
	}
	return all
}

// Close waits for operations in flight, kills every sandbox that has a
// VMM and unmounts the store volume. Paused sandboxes hold no VMM: their
// captures stay on disk for the next Open. Idempotent.
func (a *Agent) Close() error {
	all := a.quiesce()
	a.stopBackground()
	var wg sync.WaitGroup
	for _, s := range all {
		if s.getState() == StatePaused {
			a.mu.Lock()
			delete(a.sandboxes, s.rec.ID)
			a.mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); a.stop(s) }()
	}
	wg.Wait()
	if err := a.closeLazy(); err != nil {
		a.log.Error("unmount lazy memory files", "err", err)
	}
	return a.vol.Close()
}

// Detach forgets every sandbox without stopping its VMM, so that a later
// agent can adopt them (Recover). The volume stays mounted. Idempotent.
func (a *Agent) Detach() {
	all := a.quiesce()
	a.stopBackground()
	a.mu.Lock()
	a.sandboxes = map[string]*sandbox{}
	a.mu.Unlock()
	// A holder process keeps serving the lazily restored machines'
	// memory until the next agent attaches.
	a.leaveLazy()
	for _, s := range all {
		s.mu.Lock()
		s.detached = true // the watcher must not clean up a detached sandbox
		if s.client != nil {
			s.client.Close()
		}
		if r, ok := s.m.(interface{ Release() }); ok {
			r.Release() // the next agent's QMP connection must get through
		}
		s.mu.Unlock()
	}
}

func classifyIOError(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

func jsonIndent(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// MemStats is the host memory a sandbox's VMM uses: the host contract's.
type MemStats = host.MemStats

// Memory reports a sandbox's memory use.
func (a *Agent) Memory(id string) (MemStats, error) {
	s, err := a.get(id)
	if err != nil {
		return MemStats{}, err
	}
	s.mu.Lock()
	m := s.m
	s.mu.Unlock()
	if m == nil {
		return MemStats{}, fmt.Errorf("sandbox %s has no vmm: %w", id, ErrConflict)
	}
	st, err := ReadMemStats(m.PID())
	if err == nil {
		st.Lazy = a.lazyMemStats(s)
	}
	return st, err
}

// MemoryInUse is what this host's running machines hold privately, in
// bytes: the anonymous resident memory of each VMM (its heap, translation
// cache, and the guest pages it has written), not the pages of memory
// images it shares with others through the page cache. Cheap: one small
// read per machine.
func (a *Agent) MemoryInUse() int64 {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	var total int64
	for _, s := range all {
		s.mu.Lock()
		m := s.m
		s.mu.Unlock()
		if m != nil {
			total += host.AnonResidentBytes(m.PID())
		}
	}
	return total
}

// ReadMemStats reads /proc/PID/smaps_rollup.
func ReadMemStats(pid int) (MemStats, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return MemStats{}, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	var st MemStats
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		n := kib << 10
		switch k {
		case "Rss":
			st.RSSBytes = n
		case "Pss":
			st.PSSBytes = n
		case "Shared_Clean", "Shared_Dirty":
			st.SharedBytes += n
		case "Private_Clean", "Private_Dirty":
			st.PrivateBytes += n
		}
	}
	return st, nil
}

// SetNetwork changes a live sandbox's egress policy: at once for a sandbox
// that runs (its namespace's rules are replaced in one batch; established
// connections stay up), from its resume for a paused one.
func (a *Agent) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("set network: %w: %w", ErrInvalid, err)
	}
	s, err := a.get(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.state == StateStopping || s.state == StateStopped {
		s.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w", id, ErrNotFound)
	}
	ns := s.ns
	s.mu.Unlock()
	if ns != nil {
		if err := ns.SetPolicy(ctx, p); err != nil {
			return fmt.Errorf("set network of %s: %w", id, err)
		}
	}
	s.mu.Lock()
	s.rec.Network = p
	s.mu.Unlock()
	paused := s.getState() == StatePaused
	if err := s.writeRecord(paused); err != nil {
		return classifyIOError(err)
	}
	if paused {
		a.restagePaused(s) // the copy in the object store says what it resumes with
	}
	return nil
}
