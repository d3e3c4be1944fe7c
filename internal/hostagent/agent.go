// Package hostagent is the host agent: it owns the sandboxes of one host, from
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
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/lazyrestore"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/hostagent/internal/transfer"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/hostagent/volumes"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
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

	// store is the object store (Config.Store; nil: none); sync keeps
	// snapshots, paused sandboxes and templates there, with its
	// background jobs (store.go), and gives the seeds and bases of
	// downloads and packs (made with or without a store).
	store *chunkstore.Store
	sync  *storesync.Sync
	// transfers sends and receives packs of snapshots, host to host
	// (direct.go).
	transfers *transfer.Transfers
	// adoptMu is held by a resume downloading a paused sandbox from the
	// store (adoptPaused), one at a time.
	adoptMu sync.Mutex
	// lazy restores memory images lazily (Config.Lazy), and serves the
	// mount of those an earlier run restored (lazy.go).
	lazy *lazyrestore.Restorer
	// vols is the host's volumes (volumes.go). mountMu is held for
	// reading from checking a new sandbox's mounts to registering it, and
	// for writing by what must see every sandbox that mounts a volume
	// (delete, promote): none can slip in between.
	vols    *volumes.Store
	mountMu sync.RWMutex
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
	if a.vols, err = volumes.Open(filepath.Join(vol.Dir, volumesDir)); err != nil {
		vol.Close()
		return nil, fmt.Errorf("open host agent: %w", err)
	}
	a.lazy = lazyrestore.New(cfg.Lazy, lazyrestore.Host{Dir: vol.Dir, Store: a.store, Log: a.log,
		TemplateSeeds: func(ctx context.Context, key string) ([]chunkstore.Seed, func()) {
			return a.sync.TemplateSeeds(ctx, key)
		}})
	a.sync = a.newSync()
	a.transfers = transfer.New(transfer.Config{Sync: a.sync, CheckSpace: a.checkSpace, Verified: a.setVerified, Log: a.log})
	for _, d := range []string{a.sbDir, filepath.Join(vol.Dir, "forks"), filepath.Join(vol.Dir, "snapshots"), filepath.Join(vol.Dir, "tenants"), filepath.Join(vol.Dir, storesync.StoredDir), filepath.Join(vol.Dir, storesync.StoredDir, storesync.PausedRecordDir), filepath.Join(vol.Dir, fetchDir)} {
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
		if r, ok := a.sync.PausedRecord(s.id(), s.pauseID()); ok {
			in.UploadedBytes = r.Upload.BytesUploaded
		}
	} else {
		in.Stored = host.StoredUploading
		in.StoreError = a.storeError(storesync.PausedSet(s.rec.ID))
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
			if err := a.sync.TombstonePaused(id, pid); err != nil {
				// Killed all the same (a full disk must not keep a
				// sandbox from being killed); the store's copy is
				// deleted below, but a crash now would leave it.
				a.log.Error("record a killed sandbox's capture stale", "sandbox_id", id, "err", err)
			}
		}
	}
	a.stop(s)
	if pid != "" {
		a.sync.StartPausedDelete(id, pid)
	}
	return nil
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
	a.sync.Stop()
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
	if err := a.lazy.Close(); err != nil {
		a.log.Error("unmount lazy memory files", "err", err)
	}
	a.vols.Close()
	return a.vol.Close()
}

// Detach forgets every sandbox without stopping its VMM, so that a later
// agent can adopt them (Recover). The volume stays mounted. Idempotent.
func (a *Agent) Detach() {
	all := a.quiesce()
	a.sync.Stop()
	a.mu.Lock()
	a.sandboxes = map[string]*sandbox{}
	a.mu.Unlock()
	// A holder process keeps serving the lazily restored machines'
	// memory until the next agent attaches.
	a.lazy.Leave()
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
	a.vols.Close() // the next agent opens the volumes again
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
