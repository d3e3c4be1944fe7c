package hostagent

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// sandbox is one sandbox of this host. It owns its state: every change goes
// through transition (the lifecycle table), under mu.
//
// Operations that take time (create, pause, resume, snapshot, fork) run one
// at a time: each holds the operation slot from begin to its end function.
// Stopping never waits for the slot first: it cancels the operation in
// flight, kills the VMM (which makes every QMP and guest call of that
// operation fail at once), and only then waits for the operation to unwind,
// so a kill takes seconds whatever the guest or the VMM is doing.
type sandbox struct {
	dir    string // store directory: disk, memory link, state, sandbox.json, paused/
	runDir string

	slot    chan struct{} // the operation slot (capacity 1)
	gone    chan struct{} // closed when the sandbox starts stopping
	stopped chan struct{} // closed when it is stopped and its files are gone

	mu       sync.Mutex
	rec      record
	state    lifecycle.State
	m        vmm.Machine
	client   *guestproto.Client
	ready    chan struct{}      // closed once the guest answered HELLO on client
	ns       *network.Namespace // its network namespace while it has a VMM
	opCancel context.CancelFunc
	detached bool // forgotten by Detach: its VMM runs on for the next agent
	// durablePause is the PauseID of the capture the object store holds
	// durably as paused/<id> ("" if none is known to): paused.go.
	durablePause string
	// fetched is Info.FetchedBytes: what was read from the object store
	// to start the sandbox as it runs now (0 once paused).
	fetched int64
	// dropMounts: s mounts no volume but may start from a capture of a
	// sandbox that did (a snapshot's, or a fork's whose parent mounts
	// some): its guest is told to unmount them (volumes.go).
	dropMounts bool
}

func newSandbox(rec record, dir, runDir string, state lifecycle.State) *sandbox {
	return &sandbox{
		rec: rec, dir: dir, runDir: runDir, state: state,
		slot: make(chan struct{}, 1), gone: make(chan struct{}), stopped: make(chan struct{}),
	}
}

func (s *sandbox) id() string { return s.rec.ID }

// transition applies ev to s's state. Called with s.mu held.
func (s *sandbox) transitionLocked(ev lifecycle.Event) error {
	next, err := lifecycle.Next(s.state, ev)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w: %v", s.rec.ID, ErrConflict, err)
	}
	s.state = next
	return nil
}

func (s *sandbox) transition(ev lifecycle.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.transitionLocked(ev)
}

func (s *sandbox) getState() lifecycle.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// begin takes the operation slot (waiting at most until ctx ends) for an
// operation that needs the sandbox in one of the states want, and returns
// a context that stopping the sandbox cancels. Call end when done.
func (s *sandbox) begin(ctx context.Context, what string, want ...lifecycle.State) (opCtx context.Context, end func(), err error) {
	select {
	case s.slot <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("%s: waiting for another operation on sandbox %s: %w", what, s.rec.ID, ctx.Err())
	case <-s.gone:
		return nil, nil, fmt.Errorf("%s: sandbox %s is stopping: %w", what, s.rec.ID, ErrNotFound)
	}
	s.mu.Lock()
	ok := len(want) == 0
	for _, w := range want {
		ok = ok || s.state == w
	}
	if !ok || s.state == lifecycle.Stopping || s.state == lifecycle.Stopped {
		st := s.state
		s.mu.Unlock()
		<-s.slot
		if st == lifecycle.Stopping || st == lifecycle.Stopped {
			return nil, nil, fmt.Errorf("%s: sandbox %s is %s: %w", what, s.rec.ID, st, ErrNotFound)
		}
		return nil, nil, fmt.Errorf("%s: sandbox %s is %s: %w", what, s.rec.ID, st, ErrConflict)
	}
	opCtx, cancel := context.WithCancel(ctx)
	s.opCancel = cancel
	s.mu.Unlock()
	return opCtx, func() {
		s.mu.Lock()
		s.opCancel = nil
		s.mu.Unlock()
		cancel()
		<-s.slot
	}, nil
}

// stopping reports whether s has started stopping.
func (s *sandbox) stopping() bool {
	select {
	case <-s.gone:
		return true
	default:
		return false
	}
}

// errStopped is the error of an operation that a kill overtook.
func errStopped(s *sandbox, what string) error {
	return fmt.Errorf("%s: sandbox %s was killed meanwhile: %w", what, s.rec.ID, ErrNotFound)
}

// opUnwindTimeout bounds how long stopping waits for the operation in
// flight once its VMM is dead and its context canceled. Operations unwind
// in milliseconds then; the bound only keeps a bug from hanging a kill.
const opUnwindTimeout = 30 * time.Second

// stop kills s's VMM (if any) and removes its files and its entry, after
// cancelling and waiting for the operation in flight. Idempotent; a second
// call waits for the first to finish.
func (a *Agent) stop(s *sandbox) {
	s.mu.Lock()
	if s.state == lifecycle.Stopping || s.state == lifecycle.Stopped {
		s.mu.Unlock()
		<-s.stopped
		return
	}
	s.transitionLocked(lifecycle.Stop)
	close(s.gone)
	cancel, m, client := s.opCancel, s.m, s.client
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if client != nil {
		client.Close()
	}
	if m != nil {
		m.Kill()
	}
	select {
	case s.slot <- struct{}{}: // never released: nothing runs on s again
	case <-time.After(opUnwindTimeout):
		a.log.Error("operation did not end after its sandbox was killed; removing its files anyway", "sandbox_id", s.rec.ID)
	}
	// The operation may have started a new VMM (a restore) before it saw
	// the cancellation.
	s.mu.Lock()
	m2 := s.m
	s.mu.Unlock()
	if m2 != nil && m2 != m {
		m2.Kill()
	}
	a.releaseNet(s)
	if err := a.removeSandboxDir(s.dir); err != nil {
		a.log.Error("remove sandbox files", "sandbox_id", s.rec.ID, "err", err)
	}
	os.RemoveAll(s.runDir)
	s.mu.Lock()
	s.transitionLocked(lifecycle.StopDone)
	s.mu.Unlock()
	a.mu.Lock()
	if a.sandboxes[s.rec.ID] == s {
		delete(a.sandboxes, s.rec.ID)
	}
	a.mu.Unlock()
	close(s.stopped)
}

// setMachine records s's VMM and guest client (nil, nil: none).
func (s *sandbox) setMachine(m vmm.Machine, client *guestproto.Client, ready chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m, s.client, s.ready = m, client, ready
}

// writeRecord writes sandbox.json. With durable it is flushed to stable
// storage (for states that outlive the VMM: paused); otherwise a crash of
// this process keeps it (the page cache survives) but a crash of the
// machine may not, which is fine: the VMM dies with the machine.
func (s *sandbox) writeRecord(durable bool) error {
	s.mu.Lock()
	rec := s.rec
	rec.State = s.state
	s.mu.Unlock()
	return writeJSON(filepath.Join(s.dir, "sandbox.json"), rec, durable)
}

// setOp records the operation in flight in sandbox.json, so that recovery
// after a crash knows what to finish or roll back.
func (s *sandbox) setOp(op string, durable bool) error {
	s.mu.Lock()
	s.rec.Op = op
	s.mu.Unlock()
	return s.writeRecord(durable)
}

func writeJSON(path string, v any, durable bool) error {
	b, err := jsonIndent(v)
	if err != nil {
		return err
	}
	if durable {
		return manifest.WriteFile(path, b, 0o600)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// newClient returns a guest client on conn with the sandbox's exec
// defaults. rec.Cwd and rec.User never change after register, so s.mu is
// not needed (and may be held).
func (s *sandbox) newClient(conn io.ReadWriteCloser) *guestproto.Client {
	c, err := guestproto.NewClientConfig(conn, guestproto.ClientConfig{ExecCwd: s.rec.Cwd, ExecUser: s.rec.User})
	if err != nil { // a relative Cwd or bad User from a bad sandbox.json: ignore them
		return guestproto.NewClient(conn)
	}
	return c
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
	// Volumes are the volumes the sandbox mounts (volumes.go).
	Volumes []host.VolumeMount `json:"volumes,omitempty"`
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
		FetchedBytes: s.fetched, Volumes: s.rec.Volumes,
	}
}

// setFetched records what was read from the object store to start s as
// it runs now (Info.FetchedBytes).
func (s *sandbox) setFetched(n int64) {
	s.mu.Lock()
	s.fetched = n
	s.mu.Unlock()
}
