// Package hosttest is an in-memory host.Host for unit tests of the control
// plane's pure logic (quotas, rollback, TTLs, reconciling, detached
// operations, error kinds). Its sandboxes are records with a state and
// nothing else: no VMM, no guest, no files, no network. It is not a model
// of a real host's behaviour beyond the contract's states and error
// classes, and it is no substitute for the tests that run real QEMU;
// anything about VMs, guests or a host's own recovery is tested there.
//
// A test tells it what to do wrong: fail the next call of a method (Fail),
// hold it until released (Block, which also tells when the call arrived),
// fail one child of the next fork (FailForkChild), or report a sandbox
// exited (Exit) or lost without a word (Lose). Nothing in it sleeps or
// runs in the background: every effect happens in the call that makes it.
package hosttest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"testing/iotest"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Method names a method of host.Host, for Fail, Block and Calls.
type Method string

// The methods a test can fail or hold.
const (
	Create         Method = "Create"
	Kill           Method = "Kill"
	Get            Method = "Get"
	List           Method = "List"
	Fork           Method = "Fork"
	Snapshot       Method = "Snapshot"
	DeleteSnapshot Method = "DeleteSnapshot"
	Pause          Method = "Pause"
	Resume         Method = "Resume"
	SetNetwork     Method = "SetNetwork"
	Snapshots      Method = "Snapshots"
	AwaitStored    Method = "AwaitStored"
	// SnapshotPack and ReceiveSnapshot (host.DirectTransferer) name the
	// snapshot id.
	SnapshotPack    Method = "SnapshotPack"
	ReceiveSnapshot Method = "ReceiveSnapshot"
	// PullAndCreate (host.PackPuller) names the snapshot id.
	PullAndCreate Method = "PullAndCreate"
)

// Call is one call the host received: its method and the sandbox (or, for
// DeleteSnapshot, snapshot) id it named ("" for List and Snapshots).
type Call struct {
	Method Method
	ID     string
}

// Host is an in-memory host.Host (and host.SnapshotLister,
// host.Transferer: a transient capture is a snapshot marked Transient,
// and its calls are Snapshot's; host.DirectTransferer: a pack is the
// snapshot's record and 1 MiB of filler, and a host refuses one of a
// template it does not know; host.PackCreator: ReceiveSnapshot then
// Create; host.PackPuller: SnapshotPack of the host AllowPulls named,
// then ReceiveAndCreate; host.PackSourcer once AllowPulls). The zero value
// is not usable; use New. Safe for concurrent use.
type Host struct {
	// OnExit, if set, is told when Exit reports a sandbox gone (the
	// agent's OnExit callback: control.Plane.SandboxExited).
	OnExit func(id string, cause error)

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	seq       int // creation order, for List
	snapshots map[string]host.SnapshotInfo
	templates map[string]int // name -> disk MiB
	faults    []*fault
	childErrs map[int]error // child index -> error, for the next Fork
	calls     []Call
	// pausedBytes is what a pause capture holds (CaptureStats.SizeBytes).
	pausedBytes int64
	store       *Store
	breakPack   error  // the next SnapshotPack's stream fails with it halfway
	pullURL     string // where other fake hosts pull this one's packs (AllowPulls)
}

// pullable are the fake hosts that AllowPulls made reachable, by URL.
var pullable sync.Map

// AllowPulls lets other fake hosts fetch this host's packs themselves
// (PackSource names it; their PullAndCreate reaches it): hosts that can
// reach each other. Without it PackSource says it cannot.
func (h *Host) AllowPulls() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pullURL = "hosttest://" + host.NewID()
	pullable.Store(h.pullURL, h)
}

// Store is an object store several fake hosts share (UseStore): their
// snapshots and pause captures become durable in it at once, and a host
// restores a snapshot or resumes a paused sandbox it does not hold from
// it, as agents sharing an object store do.
type Store struct {
	mu        sync.Mutex
	down      bool // uploads fail: captures stay uploading, with an error
	snapshots map[string]host.SnapshotInfo
	paused    map[string]host.Info
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{snapshots: map[string]host.SnapshotInfo{}, paused: map[string]host.Info{}}
}

// Paused reports whether the store holds sandbox id's pause capture.
func (s *Store) Paused(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.paused[id]
	return ok
}

// SetDown makes uploads to the store fail (down) or work again; what
// failed meanwhile stays uploading.
func (s *Store) SetDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

// UseStore makes the host keep its snapshots and pause captures in s.
func (h *Host) UseStore(s *Store) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.store = s
}

type sandbox struct {
	info    host.Info
	seq     int
	network netpolicy.Policy
}

// New returns a host without sandboxes whose template store knows the
// template "base" with a 1024 MiB disk.
func New() *Host {
	return &Host{
		sandboxes: map[string]*sandbox{},
		snapshots: map[string]host.SnapshotInfo{},
		templates: map[string]int{"base": 1024},
		childErrs: map[int]error{},
	}
}

var (
	_ host.Host             = (*Host)(nil)
	_ host.SnapshotLister   = (*Host)(nil)
	_ host.Transferer       = (*Host)(nil)
	_ host.DirectTransferer = (*Host)(nil)
	_ host.PackCreator      = (*Host)(nil)
	_ host.PackPuller       = (*Host)(nil)
	_ host.PackSourcer      = (*Host)(nil)
)

// fault is what a test told the host to do to one call.
type fault struct {
	method Method
	id     string // "" = any
	err    error  // returned (with no effect), unless gate is set
	gate   *Gate
}

// Gate holds one call until it is released.
type Gate struct {
	reached chan struct{}
	release chan struct{}
	id      string
	err     error
}

// Reached is closed when the held call has arrived (and holds).
func (g *Gate) Reached() <-chan struct{} { return g.reached }

// ID is the id the held call named; valid once Reached is closed.
func (g *Gate) ID() string { return g.id }

// Release lets the held call go on: with err nil it does what it would
// have done, else it fails with err and has no effect. Call it once.
func (g *Gate) Release(err error) {
	g.err = err
	close(g.release)
}

// Fail makes the next call of m naming id ("" = any id) return err,
// without effect. Faults are used in the order they were added.
func (h *Host) Fail(m Method, id string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, &fault{method: m, id: id, err: err})
}

// Block makes the next call of m naming id ("" = any id) wait until the
// returned gate is released or the call's ctx ends (it then returns ctx's
// error, without effect, as a real host would).
func (h *Host) Block(m Method, id string) *Gate {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := &Gate{reached: make(chan struct{}), release: make(chan struct{})}
	h.faults = append(h.faults, &fault{method: m, id: id, gate: g})
	return g
}

// FailForkChild makes child i (0-based, in the order of childIDs) of the
// next Fork fail with err; the others are created.
func (h *Host) FailForkChild(i int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.childErrs[i] = err
}

// SetPausedBytes sets what pause captures hold on disk from now on.
func (h *Host) SetPausedBytes(n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pausedBytes = n
}

// DropTemplate makes the template store forget template name.
func (h *Host) DropTemplate(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.templates, name)
}

// BreakPack makes the stream of the next SnapshotPack fail with err
// halfway through (a connection that broke).
func (h *Host) BreakPack(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.breakPack = err
}

// AddTemplate makes the template store know template name, whose disk is
// diskMiB; every shape of it counts as baked.
func (h *Host) AddTemplate(name string, diskMiB int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.templates[name] = diskMiB
}

// Put adds or replaces a sandbox as the host has it (what it adopted
// after a restart, a create the control plane never finished).
func (h *Host) Put(info host.Info) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.put(info)
}

func (h *Host) put(info host.Info) {
	if sb, ok := h.sandboxes[info.ID]; ok {
		sb.info = info
		return
	}
	h.seq++
	h.sandboxes[info.ID] = &sandbox{info: info, seq: h.seq}
}

// PutSnapshot adds a snapshot as the host has it.
func (h *Host) PutSnapshot(si host.SnapshotInfo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snapshots[si.ID] = si
}

// HasSnapshot reports whether the host holds snapshot id.
func (h *Host) HasSnapshot(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.snapshots[id]
	return ok
}

// LoseSnapshot removes the host's own copy of snapshot id (a disk
// replaced); the object store's, if any, stays.
func (h *Host) LoseSnapshot(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.snapshots, id)
}

// Lose removes sandbox id without telling anyone (a host that lost it
// while the control plane was not listening).
func (h *Host) Lose(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.sandboxes, id)
}

// Exit removes sandbox id and tells OnExit, as a host does when a VMM
// dies by itself (or, cause host.ErrHostShutdown, when it stopped it).
func (h *Host) Exit(id string, cause error) {
	h.mu.Lock()
	delete(h.sandboxes, id)
	onExit := h.OnExit
	h.mu.Unlock()
	if onExit != nil {
		onExit(id, cause)
	}
}

// Sandbox is sandbox id as the host has it, and whether it has it.
func (h *Host) Sandbox(id string) (host.Info, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, ok := h.sandboxes[id]
	if !ok {
		return host.Info{}, false
	}
	return sb.info, true
}

// Network is the egress policy sandbox id has on the host.
func (h *Host) Network(id string) (netpolicy.Policy, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, ok := h.sandboxes[id]
	if !ok {
		return netpolicy.Policy{}, false
	}
	return sb.network, true
}

// Calls is every call the host received, in order.
func (h *Host) Calls() []Call {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Call(nil), h.calls...)
}

// CallsOf is how many calls of m naming id the host received.
func (h *Host) CallsOf(m Method, id string) int {
	n := 0
	for _, c := range h.Calls() {
		if c.Method == m && c.ID == id {
			n++
		}
	}
	return n
}

// enter records a call and applies the first fault that matches it: its
// error, or its gate's (after holding the call). Called without h.mu.
func (h *Host) enter(ctx context.Context, m Method, id string) error {
	h.mu.Lock()
	h.calls = append(h.calls, Call{Method: m, ID: id})
	var f *fault
	for i, x := range h.faults {
		if x.method == m && (x.id == "" || x.id == id) {
			f = x
			h.faults = append(h.faults[:i:i], h.faults[i+1:]...)
			break
		}
	}
	h.mu.Unlock()
	if f == nil {
		return nil
	}
	if f.gate == nil {
		return f.err
	}
	g := f.gate
	g.id = id
	close(g.reached)
	select {
	case <-g.release:
		return g.err
	case <-ctx.Done():
		// A release that came first wins over a ctx that ended since.
		select {
		case <-g.release:
			return g.err
		default:
			return ctx.Err()
		}
	}
}

// get is sandbox id, or ErrNotFound. Called with h.mu held.
func (h *Host) get(id string) (*sandbox, error) {
	sb, ok := h.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, host.ErrNotFound)
	}
	return sb, nil
}

// in is sandbox id if it is in state st, else ErrNotFound or ErrConflict.
// Called with h.mu held.
func (h *Host) in(id string, st lifecycle.State) (*sandbox, error) {
	sb, err := h.get(id)
	if err != nil {
		return nil, err
	}
	if sb.info.State != st {
		return nil, fmt.Errorf("sandbox %s is %s: %w", id, sb.info.State, host.ErrConflict)
	}
	return sb, nil
}

// Create adds a running sandbox (ErrConflict if the id is taken).
func (h *Host) Create(ctx context.Context, req host.CreateRequest) (host.Info, error) {
	if req.ID == "" {
		req.ID = host.NewID()
	}
	if err := h.enter(ctx, Create, req.ID); err != nil {
		return host.Info{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sandboxes[req.ID]; ok {
		return host.Info{}, fmt.Errorf("sandbox %s: %w", req.ID, host.ErrConflict)
	}
	info := host.Info{ID: req.ID, Template: req.Template, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs,
		State: lifecycle.Running, CreatedAt: time.Now().UTC(), Hostname: "sandbox-" + req.ID, Snapshot: req.SnapshotID,
		Volumes: req.Volumes}
	for _, m := range req.Volumes {
		if !h.HasVolume(m.Volume) {
			return host.Info{}, fmt.Errorf("volume %s: %w", m.Volume, host.ErrNotFound)
		}
	}
	if req.SnapshotID != "" {
		si, ok := h.snapshots[req.SnapshotID]
		if !ok && h.store != nil {
			h.store.mu.Lock()
			si, ok = h.store.snapshots[req.SnapshotID]
			h.store.mu.Unlock()
			if ok {
				h.snapshots[req.SnapshotID] = si // fetched: the host keeps it
			}
		}
		if !ok {
			return host.Info{}, fmt.Errorf("snapshot %s: %w", req.SnapshotID, host.ErrNotFound)
		}
		info.Template, info.MemoryMiB, info.VCPUs = si.Template, si.Spec.MemoryMiB, si.Spec.VCPUs
	}
	h.put(info)
	h.sandboxes[req.ID].network = req.Network
	return info, nil
}

// Kill removes a sandbox in any state (ErrNotFound if there is none).
func (h *Host) Kill(ctx context.Context, id string) error {
	if err := h.enter(ctx, Kill, id); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.get(id); err != nil {
		return err
	}
	delete(h.sandboxes, id)
	if h.store != nil {
		h.store.mu.Lock()
		delete(h.store.paused, id)
		h.store.mu.Unlock()
	}
	return nil
}

// Get describes a sandbox.
func (h *Host) Get(ctx context.Context, id string) (host.Info, error) {
	if err := h.enter(ctx, Get, id); err != nil {
		return host.Info{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, err := h.get(id)
	if err != nil {
		return host.Info{}, err
	}
	return sb.info, nil
}

// List describes every sandbox, oldest first.
func (h *Host) List(ctx context.Context) ([]host.Info, error) {
	if err := h.enter(ctx, List, ""); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var sbs []*sandbox
	for _, sb := range h.sandboxes {
		sbs = append(sbs, sb)
	}
	sort.Slice(sbs, func(i, j int) bool { return sbs[i].seq < sbs[j].seq })
	out := []host.Info{}
	for _, sb := range sbs {
		out = append(out, sb.info)
	}
	return out, nil
}

// Guest is not supported: the fake has no guests.
func (h *Host) Guest(ctx context.Context, id string) (host.Guest, error) {
	return nil, fmt.Errorf("hosttest has no guests: %w", errors.ErrUnsupported)
}

// Memory reports zeros for a running sandbox.
func (h *Host) Memory(ctx context.Context, id string) (host.MemStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.in(id, lifecycle.Running); err != nil {
		return host.MemStats{}, err
	}
	return host.MemStats{}, nil
}

// Templates is the fake's template store.
func (h *Host) Templates() host.Templates { return fakeTemplates{h} }

// TemplateParams fills in defaults: template "base", 512 MiB, 1 vCPU.
func (h *Host) TemplateParams(name string, memoryMiB, vcpus int) templates.Params {
	if name == "" {
		name = "base"
	}
	if memoryMiB == 0 {
		memoryMiB = 512
	}
	if vcpus == 0 {
		vcpus = 1
	}
	return templates.Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
}

// Accel is TCG.
func (h *Host) Accel() accel.Accel { return accel.TCG }

// Fork creates one running child of running sandbox id per child id,
// except those FailForkChild named, which report their error.
func (h *Host) Fork(ctx context.Context, id string, childIDs []string) (host.ForkResult, error) {
	if err := h.enter(ctx, Fork, id); err != nil {
		return host.ForkResult{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	childErrs := h.childErrs
	h.childErrs = map[int]error{}
	parent, err := h.in(id, lifecycle.Running)
	if err != nil {
		return host.ForkResult{}, err
	}
	res := host.ForkResult{Capture: host.CaptureStats{Paused: time.Millisecond, PausedMS: 1}}
	for i, cid := range childIDs {
		if err := childErrs[i]; err != nil {
			res.Children = append(res.Children, host.ForkChild{Info: host.Info{ID: cid}, Err: err})
			continue
		}
		info := parent.info
		info.ID, info.ParentID, info.CreatedAt, info.Busy = cid, id, time.Now().UTC(), false
		h.put(info)
		h.sandboxes[cid].network = parent.network
		res.Children = append(res.Children, host.ForkChild{Info: info})
	}
	return res, nil
}

// Snapshot records snapshot snapshotID of running sandbox id.
func (h *Host) Snapshot(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	return h.snapshot(ctx, id, snapshotID, false)
}

// SnapshotTransient is Snapshot of a transient capture.
func (h *Host) SnapshotTransient(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	return h.snapshot(ctx, id, snapshotID, true)
}

// AwaitStored returns snapshot snapshotID at once if it is durable (or
// the host has no store), else after wait: a capture made while the store
// was down stays uploading.
func (h *Host) AwaitStored(ctx context.Context, snapshotID string, wait time.Duration) (host.SnapshotInfo, error) {
	if err := h.enter(ctx, AwaitStored, snapshotID); err != nil {
		return host.SnapshotInfo{}, err
	}
	get := func() (host.SnapshotInfo, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		si, ok := h.snapshots[snapshotID]
		if !ok {
			return si, fmt.Errorf("snapshot %s: %w", snapshotID, host.ErrNotFound)
		}
		return si, nil
	}
	si, err := get()
	if err != nil || si.Stored != host.StoredUploading {
		return si, err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return host.SnapshotInfo{}, ctx.Err()
	}
	return get()
}

func (h *Host) snapshot(ctx context.Context, id, snapshotID string, transient bool) (host.SnapshotInfo, error) {
	if err := h.enter(ctx, Snapshot, id); err != nil {
		return host.SnapshotInfo{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, err := h.in(id, lifecycle.Running)
	if err != nil {
		return host.SnapshotInfo{}, err
	}
	si := host.SnapshotInfo{ID: snapshotID, SandboxID: id, Template: sb.info.Template,
		Spec: host.Shape{MemoryMiB: sb.info.MemoryMiB, VCPUs: sb.info.VCPUs}, CreatedAt: time.Now().UTC(), SizeBytes: 1 << 20, Transient: transient}
	if h.store != nil {
		h.store.mu.Lock()
		if h.store.down {
			si.Stored, si.StoreError = host.StoredUploading, "object store unavailable"
		} else {
			si.Stored = host.StoredDurable
			h.store.snapshots[snapshotID] = si
		}
		h.store.mu.Unlock()
	}
	h.snapshots[snapshotID] = si
	return si, nil
}

// packFiller is the size of the files a fake pack carries.
const packFiller = 1 << 20

// SnapshotPack opens snapshot snapshotID as a fake pack: its record as a
// JSON line, then packFiller bytes.
func (h *Host) SnapshotPack(ctx context.Context, snapshotID string) (io.ReadCloser, error) {
	if err := h.enter(ctx, SnapshotPack, snapshotID); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	si, ok := h.snapshots[snapshotID]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: %w", snapshotID, host.ErrNotFound)
	}
	line, _ := json.Marshal(si)
	var r io.Reader = io.MultiReader(bytes.NewReader(append(line, '\n')), bytes.NewReader(make([]byte, packFiller)))
	if err := h.breakPack; err != nil {
		h.breakPack = nil
		r = io.MultiReader(io.LimitReader(r, int64(len(line))+packFiller/2), iotest.ErrReader(err))
	}
	return io.NopCloser(r), nil
}

// ReceiveSnapshot reads a fake pack (SnapshotPack's) and keeps its
// snapshot; templates.ErrNotFound if the host does not know its template
// (before reading the rest), host.ErrCorrupt if the stream is short or
// fails.
func (h *Host) ReceiveSnapshot(ctx context.Context, snapshotID string, r io.Reader) (host.SnapshotInfo, error) {
	if err := h.enter(ctx, ReceiveSnapshot, snapshotID); err != nil {
		return host.SnapshotInfo{}, err
	}
	br := bufio.NewReader(r)
	line, err := br.ReadBytes('\n')
	var si host.SnapshotInfo
	if err == nil {
		err = json.Unmarshal(line, &si)
	}
	if err != nil {
		return host.SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: %v", snapshotID, host.ErrCorrupt, err)
	}
	h.mu.Lock()
	_, known := h.templates[si.Template]
	h.mu.Unlock()
	if !known {
		return host.SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: no template %q here", snapshotID, templates.ErrNotFound, si.Template)
	}
	n, err := io.Copy(io.Discard, br)
	if err != nil || n != packFiller {
		return host.SnapshotInfo{}, fmt.Errorf("receive snapshot %s: %w: %d bytes of %d (%v)", snapshotID, host.ErrCorrupt, n, packFiller, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.snapshots[snapshotID]; ok {
		return host.SnapshotInfo{}, fmt.Errorf("snapshot %s: %w: exists", snapshotID, host.ErrConflict)
	}
	si.Stored, si.StoreError, si.UploadedBytes = "", "", 0
	h.snapshots[snapshotID] = si
	si.FetchedBytes = int64(len(line)) + n
	return si, nil
}

// ReceiveAndCreate is ReceiveSnapshot, then Create from what it received
// (host.PackCreator), each a call of its own (the fault of either
// applies).
func (h *Host) ReceiveAndCreate(ctx context.Context, req host.CreateRequest, r io.Reader) (host.Info, host.SnapshotInfo, error) {
	si, err := h.ReceiveSnapshot(ctx, req.SnapshotID, r)
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	in, err := h.Create(ctx, req)
	return in, si, err
}

// PackSource names this host for another's PullAndCreate, if AllowPulls
// was called; the ticket is the snapshot's id.
func (h *Host) PackSource(snapshotID string, ttl time.Duration) (host.PackSource, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return host.PackSource{URL: h.pullURL, Ticket: snapshotID}, h.pullURL != ""
}

// PullAndCreate fetches the pack of req.SnapshotID from the host from
// names (SnapshotPack there) and makes req from it (ReceiveAndCreate);
// host.ErrUnavailable, nothing received, if that host cannot be reached
// or refuses the ticket.
func (h *Host) PullAndCreate(ctx context.Context, req host.CreateRequest, from host.PackSource) (host.Info, host.SnapshotInfo, error) {
	if err := h.enter(ctx, PullAndCreate, req.SnapshotID); err != nil {
		return host.Info{}, host.SnapshotInfo{}, err
	}
	src, ok := pullable.Load(from.URL)
	if !ok || from.Ticket != req.SnapshotID {
		return host.Info{}, host.SnapshotInfo{}, fmt.Errorf("%w: cannot fetch the pack of %s from %q", host.ErrUnavailable, req.SnapshotID, from.URL)
	}
	rc, err := src.(*Host).SnapshotPack(ctx, req.SnapshotID)
	if err != nil {
		return host.Info{}, host.SnapshotInfo{}, fmt.Errorf("%w: fetch the pack of %s: %v", host.ErrUnavailable, req.SnapshotID, err)
	}
	defer rc.Close()
	return h.ReceiveAndCreate(ctx, req, rc)
}

// DeleteSnapshot removes a snapshot (ErrNotFound if there is none).
func (h *Host) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := h.enter(ctx, DeleteSnapshot, snapshotID); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.snapshots[snapshotID]; !ok {
		return fmt.Errorf("snapshot %s: %w", snapshotID, host.ErrNotFound)
	}
	delete(h.snapshots, snapshotID)
	if h.store != nil {
		h.store.mu.Lock()
		delete(h.store.snapshots, snapshotID)
		h.store.mu.Unlock()
	}
	return nil
}

// Snapshots lists the host's snapshots, oldest first.
func (h *Host) Snapshots(ctx context.Context) ([]host.SnapshotInfo, error) {
	if err := h.enter(ctx, Snapshots, ""); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := []host.SnapshotInfo{}
	for _, si := range h.snapshots {
		out = append(out, si)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Pause makes a running sandbox paused (ErrConflict in another state).
func (h *Host) Pause(ctx context.Context, id string) (host.CaptureStats, error) {
	if err := h.enter(ctx, Pause, id); err != nil {
		return host.CaptureStats{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, err := h.in(id, lifecycle.Running)
	if err != nil {
		return host.CaptureStats{}, err
	}
	sb.info.State = lifecycle.Paused
	if h.store != nil {
		h.store.mu.Lock()
		if h.store.down {
			sb.info.Stored, sb.info.StoreError = host.StoredUploading, "object store unavailable"
		} else {
			sb.info.Stored = host.StoredDurable
			h.store.paused[id] = sb.info
		}
		h.store.mu.Unlock()
	}
	return host.CaptureStats{Paused: time.Millisecond, PausedMS: 1, SizeBytes: h.pausedBytes}, nil
}

// Resume makes a paused sandbox running (ErrConflict in another state).
func (h *Host) Resume(ctx context.Context, id string) (host.Info, error) {
	if err := h.enter(ctx, Resume, id); err != nil {
		return host.Info{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, held := h.sandboxes[id]; !held && h.store != nil {
		// Not this host's: fetch its capture from the store.
		h.store.mu.Lock()
		info, ok := h.store.paused[id]
		delete(h.store.paused, id)
		h.store.mu.Unlock()
		if ok {
			h.put(info)
		}
	}
	sb, err := h.in(id, lifecycle.Paused)
	if err != nil {
		return host.Info{}, err
	}
	sb.info.State, sb.info.Stored = lifecycle.Running, ""
	if h.store != nil {
		h.store.mu.Lock()
		delete(h.store.paused, id)
		h.store.mu.Unlock()
	}
	return sb.info, nil
}

// SetNetwork sets a live sandbox's egress policy.
func (h *Host) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	if err := h.enter(ctx, SetNetwork, id); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	sb, err := h.get(id)
	if err != nil {
		return err
	}
	sb.network = p
	return nil
}

// fakeTemplates is the fake's template store: the names AddTemplate added,
// baked at every shape.
type fakeTemplates struct{ h *Host }

func (t fakeTemplates) Lookup(ctx context.Context, p templates.Params) (*templates.Meta, string, error) {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	disk, ok := t.h.templates[p.Name]
	if !ok {
		return nil, "", fmt.Errorf("template %q: %w", p.Name, templates.ErrNotFound)
	}
	return &templates.Meta{Params: p, DiskMiB: disk}, "", nil
}

func (t fakeTemplates) List(ctx context.Context) ([]templates.Meta, error) { return nil, nil }

func (t fakeTemplates) Names(ctx context.Context) ([]string, error) {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	var names []string
	for n := range t.h.templates {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

func (t fakeTemplates) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error) {
	tm, _, err := t.Lookup(ctx, p)
	return tm, err
}
