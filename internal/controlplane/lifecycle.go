package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// The control plane's half of a sandbox's lifecycle (see Plane): state
// transitions, detached operations, create, stop, pause and resume,
// reconciling with the host, and the TTL loop.

// transition applies ev to sandbox id's record and then mut, in one catalog
// transaction. A sandbox in a state where ev cannot happen is a conflict
// naming its state. It completes even if ctx is canceled.
func (p *Plane) transition(ctx context.Context, id string, ev lifecycle.Event, mut func(*catalog.Sandbox)) (catalog.Sandbox, error) {
	return p.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
		next, err := lifecycle.Next(lifecycle.State(x.State), ev)
		if err != nil {
			return &stateConflict{id: x.ID, state: x.State, ev: ev}
		}
		x.State = string(next)
		x.UpdatedAt = p.now()
		if mut != nil {
			mut(x)
		}
		return nil
	})
}

// stateConflict is a transition the record's state does not allow.
type stateConflict struct {
	id, state string
	ev        lifecycle.Event
}

func (e *stateConflict) Error() string {
	return fmt.Sprintf("sandbox %s is %s: cannot %s", e.id, e.state, e.ev)
}

// op is one long operation on a sandbox, running detached from requests.
type op struct {
	kind string
	done chan struct{}
	sb   catalog.Sandbox // the record as the operation left it
	val  any             // the operation's own result (capture stats, a snapshot, fork children)
	err  error
}

// wait returns the operation's outcome, or ctx's error if ctx ends first
// (the operation goes on).
func (o *op) wait(ctx context.Context) (catalog.Sandbox, any, error) {
	select {
	case <-o.done:
		return o.sb, o.val, o.err
	case <-ctx.Done():
		return catalog.Sandbox{}, nil, ctx.Err()
	}
}

// detach runs fn as operation kind on sandbox id, detached from the
// request: fn gets the plane's own context, canceled only when the server
// shuts down. A request for the same kind while one runs joins it (a
// client retrying a resume waits for the first); another kind is a
// conflict. The sandbox is busy meanwhile: Resync and the TTL loop leave
// it alone.
func (p *Plane) detach(id, kind string, fn func(ctx context.Context) (catalog.Sandbox, any, error)) (*op, error) {
	p.mu.Lock()
	if o, ok := p.ops[id]; ok {
		p.mu.Unlock()
		if o.kind == kind {
			return o, nil
		}
		return nil, Errorf(Conflict, "sandbox %s is busy: a %s is in progress", id, o.kind)
	}
	if p.closing {
		p.mu.Unlock()
		return nil, Errorf(Unavailable, "the server is shutting down")
	}
	o := &op{kind: kind, done: make(chan struct{})}
	p.ops[id] = o
	p.busy[id]++
	p.opsWG.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.opsWG.Done()
		o.sb, o.val, o.err = fn(p.life)
		p.mu.Lock()
		delete(p.ops, id)
		p.decBusy(id)
		p.mu.Unlock()
		close(o.done)
	}()
	return o, nil
}

// background runs fn, the tail of an operation that its caller need not
// wait for, in a goroutine that Shutdown waits for. Only from within an
// operation (detach's fn): opsWG is above zero then, so Shutdown's wait
// cannot have ended.
func (p *Plane) background(fn func()) {
	p.opsWG.Add(1)
	p.tailsWG.Add(1)
	go func() {
		defer p.opsWG.Done()
		defer p.tailsWG.Done()
		fn()
	}()
}

// Shutdown cancels the operations in flight (on the host they roll back:
// a resume leaves the sandbox paused, a pause leaves it running) and waits
// for them, at most until ctx ends; later ones are refused (unavailable).
// Requests must have stopped first.
func (p *Plane) Shutdown(ctx context.Context) {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.stopLife()
	done := make(chan struct{})
	go func() { p.opsWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.log.Warn("operations still running at shutdown")
	}
}

// setBusy marks a sandbox busy (counted: create, TTL expiry and
// operations may overlap) or releases one mark.
func (p *Plane) setBusy(id string, busy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if busy {
		p.busy[id]++
	} else {
		p.decBusy(id)
	}
}

// decBusy releases one busy mark. Called with p.mu held.
func (p *Plane) decBusy(id string) {
	if p.busy[id]--; p.busy[id] <= 0 {
		delete(p.busy, id)
	}
}

func (p *Plane) isBusy(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[id] > 0
}

// create reserves a sandbox against its key's quota (state starting),
// restores it on the host and records it running; its TTL counts from
// then. A kill that arrives while it starts wins: the sandbox is stopped
// and the create fails with a conflict.
func (p *Plane) create(ctx context.Context, key catalog.Key, sb catalog.Sandbox, req host.CreateRequest) (catalog.Sandbox, error) {
	// Busy from before the record exists: Resync leaves it alone.
	p.setBusy(sb.ID, true)
	defer p.setBusy(sb.ID, false)
	if err := p.reserve(ctx, key, sb); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	t0 := time.Now()
	req.ID, req.Owner = sb.ID, key.ID
	h, err := p.on(sb.HostID)
	if err == nil {
		_, err = h.Create(ctx, req)
	}
	if err != nil {
		p.metrics.creates.WithLabelValues("error").Inc()
		// The record only held the quota reservation.
		if derr := p.cat.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil && !errors.Is(derr, catalog.ErrNotFound) {
			p.log.Error("remove record of failed create", "sandbox_id", sb.ID, "err", derr)
		}
		return catalog.Sandbox{}, err
	}
	p.metrics.createSeconds.Observe(time.Since(t0).Seconds())
	p.metrics.creates.WithLabelValues("ok").Inc()
	sb, err = p.started(ctx, h, sb.ID)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	p.log.Info("sandbox created", "sandbox_id", sb.ID, "host_id", sb.HostID, "key_id", key.ID, "template", req.Template, "snapshot_id", req.SnapshotID, "dur_ms", time.Since(t0).Milliseconds())
	return sb, nil
}

// started records that a sandbox host h restored runs; its TTL (the
// record's: one set while it started counts) counts from now. If it was
// killed meanwhile, the host's sandbox is stopped too.
func (p *Plane) started(ctx context.Context, h host.Host, id string) (catalog.Sandbox, error) {
	sb, err := p.transition(ctx, id, lifecycle.Started, func(x *catalog.Sandbox) {
		x.ExpiresAt = p.now().Add(p.ttlOf(*x))
	})
	if err != nil {
		h.Kill(context.WithoutCancel(ctx), id)
		var sc *stateConflict
		if errors.As(err, &sc) || errors.Is(err, catalog.ErrNotFound) {
			return catalog.Sandbox{}, Errorf(Conflict, "sandbox %s was killed while it was starting", id)
		}
		return catalog.Sandbox{}, fmt.Errorf("record sandbox: %w", err)
	}
	return sb, nil
}

// Stop kills a sandbox on its host and records it stopped (reason: why,
// e.g. "killed", "key_revoked"). Stopping a
// stopped sandbox is a no-op. The reason is recorded as the stop begins
// (state stopping), so that a stop a crash interrupts, finished later by
// Resync, or one already under way, keeps its own. If the host cannot be
// reached the record stays stopping, due at once: the TTL loop retries it
// every tick (and Resync finishes it).
func (p *Plane) Stop(ctx context.Context, id, reason string) error {
	ctx = context.WithoutCancel(ctx)
	sb, err := p.cat.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("stop sandbox: %w", err)
	}
	if sb.State == catalog.StateStopped {
		return nil
	}
	if sb.State != catalog.StateStopping {
		sb, err = p.transition(ctx, id, lifecycle.Stop, func(x *catalog.Sandbox) { x.StopReason = reason })
		if err != nil {
			var sc *stateConflict
			if !errors.As(err, &sc) || sc.state != catalog.StateStopped && sc.state != catalog.StateStopping {
				return fmt.Errorf("stop sandbox %s: %w", id, err)
			}
			if sc.state == catalog.StateStopped {
				return nil
			}
			sb, err = p.cat.GetSandbox(ctx, id)
			if err != nil {
				return fmt.Errorf("stop sandbox: %w", err)
			}
		}
	}
	if sb.StopReason != "" {
		reason = sb.StopReason // the stop under way decided why
	}
	h, err := p.fleet.Host(sb.HostID)
	if errors.Is(err, ErrHostLost) || errors.Is(err, ErrUnknownHost) {
		// Nothing can reach it: the record is stopped now (the quota
		// is free), and the host, if it returns, kills what it still
		// has of it (Resync: a sandbox the catalog does not list as live).
		p.log.Warn("sandbox stopped without its host", "sandbox_id", id, "host_id", sb.HostID, "err", err)
		return p.markStopped(ctx, id, reason)
	}
	if err == nil {
		err = h.Kill(ctx, id)
	}
	if err != nil && !errors.Is(err, host.ErrNotFound) {
		p.retryStop(ctx, id)
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	return p.markStopped(ctx, id, reason)
}

// retryStop makes the record of a stop that could not reach its host due
// now, so that the TTL loop, which retries the stops of due records, retries
// it at its next tick: a paused sandbox's record is never due otherwise,
// and a running one's only when its TTL runs out.
func (p *Plane) retryStop(ctx context.Context, id string) {
	_, err := p.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		if x.State != catalog.StateStopping {
			return errChanged
		}
		if now := p.now(); x.ExpiresAt.IsZero() || x.ExpiresAt.After(now) {
			x.ExpiresAt = now
		}
		return nil
	})
	if err != nil && !errors.Is(err, errChanged) && !errors.Is(err, catalog.ErrNotFound) {
		p.log.Warn("make a stop to retry due", "sandbox_id", id, "err", err)
	}
}

// markStopped records that a sandbox is gone, from any live state (its
// host no longer has it). A stop under way keeps the reason it was
// recorded with (Stop): a kill whose host reports the sandbox gone for
// its own reason meanwhile (a host shutdown's exit event delivered late)
// is still the kill the user was told succeeded.
func (p *Plane) markStopped(ctx context.Context, id, reason string) error {
	_, err := p.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
		if x.State == catalog.StateStopped {
			return nil
		}
		if x.State == catalog.StateStopping && x.StopReason != "" {
			reason = x.StopReason
		}
		now := p.now()
		x.State = catalog.StateStopped
		x.StopReason = reason
		x.StoppedAt = now
		x.UpdatedAt = now
		x.PausedBytes = 0
		return nil
	})
	if err != nil {
		return fmt.Errorf("record stop of %s: %w", id, err)
	}
	p.gone(id)
	p.log.Info("sandbox stopped", "sandbox_id", id, "reason", reason)
	return nil
}

// pause captures a running sandbox to disk and stops its VMM, detached
// from the caller. A paused sandbox does not expire. If the capture fails
// the sandbox runs on and the error is recorded.
func (p *Plane) pause(id string) (*op, error) {
	return p.detach(id, "pause", func(ctx context.Context) (catalog.Sandbox, any, error) {
		sb, err := p.transition(ctx, id, lifecycle.Pause, func(x *catalog.Sandbox) { x.LastError = "" })
		if err != nil {
			return catalog.Sandbox{}, nil, err
		}
		h, err := p.on(sb.HostID)
		var st host.CaptureStats
		if err == nil {
			st, err = h.Pause(ctx, id)
		}
		if err != nil {
			return p.failed(ctx, id, lifecycle.PauseFailed, "pause", err)
		}
		p.metrics.pauses.Inc()
		p.gone(id) // its guest is gone until it resumes
		sb, err = p.transition(ctx, id, lifecycle.PauseDone, func(x *catalog.Sandbox) {
			x.ExpiresAt = time.Time{}
			x.PausedBytes = st.SizeBytes
		})
		return sb, st, err
	})
}

// resume restores a paused sandbox, detached from the caller, on its
// host (or, if its host is lost, on another one, which fetches its capture
// from the object store). If the restore fails the sandbox stays paused
// with its capture, and the error is recorded (last_error).
func (p *Plane) resume(id string) (*op, error) { return p.resumeOn(id, "") }

// resumeOn is resume on host to ("": the sandbox's own, or another if
// its own is lost). The record names the host that resumed it.
func (p *Plane) resumeOn(id, to string) (*op, error) {
	return p.detach(id, "resume", func(ctx context.Context) (catalog.Sandbox, any, error) {
		sb, err := p.transition(ctx, id, lifecycle.Resume, func(x *catalog.Sandbox) { x.LastError = "" })
		if err != nil {
			return catalog.Sandbox{}, nil, err
		}
		hostID := to
		if hostID == "" {
			hostID = sb.HostID
			if _, err := p.fleet.Host(hostID); errors.Is(err, ErrHostLost) {
				if cs, perr := p.placeElsewhere(ctx, sb); perr == nil {
					p.log.Info("resuming a sandbox of a lost host elsewhere", "sandbox_id", id, "from", sb.HostID, "to", cs.Host, "reason", cs.Reason)
					hostID = cs.Host
				}
			}
		}
		h, err := p.on(hostID)
		if err == nil {
			_, err = h.Resume(ctx, id)
		}
		if err != nil && hostID != sb.HostID && errors.Is(err, host.ErrNotFound) {
			// Another host has no capture of it to fetch: it is still
			// its own host's, not gone.
			err = &Error{Kind: Unavailable, Msg: fmt.Sprintf("host %s cannot resume sandbox %s: its capture is not in the object store (it resumes on host %s when that host is back)", hostID, id, sb.HostID),
				Err: fmt.Errorf("resume on host %s: %v", hostID, err)} // not wrapped: the sandbox is not gone
		}
		if err != nil {
			return p.failed(ctx, id, lifecycle.ResumeFailed, "resume", err)
		}
		failpoint.Hit("api-resume-restored")
		ttl := p.ttlOf(sb)
		sb, err = p.transition(ctx, id, lifecycle.ResumeDone, func(x *catalog.Sandbox) {
			x.ExpiresAt = p.now().Add(ttl)
			x.PausedBytes = 0
			x.HostID = hostID
		})
		return sb, nil, err
	})
}

// failed records an operation's failure: the sandbox goes back (ev) with
// the error's user message as its last_error, or, if its host no longer
// has it, it is stopped. The operation's error is returned.
func (p *Plane) failed(ctx context.Context, id string, ev lifecycle.Event, what string, opErr error) (catalog.Sandbox, any, error) {
	if errors.Is(opErr, host.ErrNotFound) {
		// Killed meanwhile (its record is stopping: the kill records
		// why), or its VMM died: that is recorded by SandboxExited; make
		// sure it is.
		_, err := p.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
			if x.State == catalog.StateStopped || x.State == catalog.StateStopping {
				return nil
			}
			x.UpdatedAt = p.now()
			return p.stoppedBy("vmm_exited")(x)
		})
		if err != nil && !errors.Is(err, catalog.ErrNotFound) {
			p.log.Error("record the stop of a sandbox gone during a "+what, "sandbox_id", id, "err", err)
		}
		sb, _ := p.cat.GetSandbox(ctx, id)
		return sb, nil, opErr
	}
	ce := Classify(opErr)
	if ce.Kind.ServerSide() {
		p.log.Error(what+" failed", "sandbox_id", id, "err", opErr)
	}
	msg := ce.Msg
	if errors.Is(opErr, context.Canceled) && p.life.Err() != nil {
		// Shutdown canceled it, not a user (whose request the operation
		// is detached from): say so, as Resync does of a restart.
		msg = "interrupted by a server shutdown; the sandbox runs on"
		if ev == lifecycle.ResumeFailed {
			msg = "interrupted by a server shutdown; resume it again"
		}
	}
	sb, err := p.transition(ctx, id, ev, func(x *catalog.Sandbox) { x.LastError = what + " failed: " + msg })
	if err != nil {
		p.log.Warn("record failed "+what, "sandbox_id", id, "err", err)
	}
	return sb, nil, opErr
}

// Pause pauses running sandbox id and waits for it (a pause in flight is
// joined); the sandbox as the pause left it. If ctx ends first the pause
// goes on. A sandbox that is not running is a conflict.
func (p *Plane) Pause(ctx context.Context, id string) (catalog.Sandbox, error) {
	return p.waitOp(ctx, p.pause, id, catalog.StateRunning)
}

// Resume resumes paused sandbox id and waits for it, as Pause.
func (p *Plane) Resume(ctx context.Context, id string) (catalog.Sandbox, error) {
	return p.waitOp(ctx, p.resume, id, catalog.StatePaused)
}

// waitOp runs pause or resume (run) on sandbox id and waits; a state the
// operation does not start from (from) is a conflict.
func (p *Plane) waitOp(ctx context.Context, run func(id string) (*op, error), id, from string) (catalog.Sandbox, error) {
	o, err := run(id)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	sb, _, err := o.wait(ctx)
	var sc *stateConflict
	if errors.As(err, &sc) {
		err = Errorf(Conflict, "sandbox %s is %s, not %s", sc.id, sc.state, from)
	}
	return sb, err
}

// ttlOf is a sandbox's TTL.
func (p *Plane) ttlOf(sb catalog.Sandbox) time.Duration {
	if ttl := time.Duration(sb.TTLSeconds) * time.Second; ttl > 0 {
		return ttl
	}
	return p.cfg.DefaultTTL
}

// StopForShutdown stops a sandbox because the server is shutting down.
func (p *Plane) StopForShutdown(ctx context.Context, id string) error {
	return p.Stop(ctx, id, "server_shutdown")
}

// SandboxExited is the host agent's OnExit callback: a VMM died by itself
// or, if cause is host.ErrHostShutdown, a host agent stopped it as it shut down.
func (p *Plane) SandboxExited(id string, cause error) {
	reason := "vmm_exited"
	if errors.Is(cause, host.ErrHostShutdown) {
		reason = "host_shutdown"
	}
	p.log.Warn("sandbox stopped by its host", "sandbox_id", id, "reason", reason, "err", cause)
	if err := p.markStopped(context.Background(), id, reason); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		p.log.Error("record vmm exit", "sandbox_id", id, "err", err)
	}
}

// Reconcile makes the catalog and the host agree after a restart of the
// all-in-one server: see Resync; adopted are the sandboxes the host kept
// (agent.Recovered without an error).
func (p *Plane) Reconcile(ctx context.Context, adopted []string) error {
	h, err := p.on(p.cfg.HostID)
	if err != nil {
		return err
	}
	return p.Resync(ctx, func(ctx context.Context) ([]host.Info, error) {
		var live []host.Info
		for _, id := range adopted {
			if info, err := h.Get(ctx, id); err == nil {
				live = append(live, info)
			}
		}
		return live, nil
	})
}

// errChanged aborts a catalog update whose record changed since Resync
// read it.
var errChanged = errors.New("changed meanwhile")

// Resync makes the catalog agree with what the host lists (list: the
// host's sandboxes), after a restart or when the server reconnects to a
// remote host that it may have missed events from. The host is the truth
// about what exists and in which settled state:
//
//   - a live record whose sandbox the host does not have is stopped
//     (vmm_exited, or host_restarted if it was still starting);
//   - a record the host has running or paused takes that state: a pause
//     or resume that a crash interrupted ends as the host finished or
//     rolled it back (a resume rolled back says so in last_error);
//   - a record stopping is finished (the host's sandbox is killed);
//   - a sandbox the host has that the catalog does not list as live is
//     killed (a create that never finished);
//   - a snapshot the host completed that the catalog never recorded (a
//     crash between the two) is recorded for the key that owns its
//     sandbox.
//
// It is safe while requests are served: the catalog is read before the
// host is listed, sandboxes being created or operated on (busy) are left
// alone, and a record that changed since it was read is not touched.
func (p *Plane) Resync(ctx context.Context, list func(context.Context) ([]host.Info, error)) error {
	return p.ResyncHost(ctx, p.cfg.HostID, list)
}

// ResyncHost is Resync for the sandboxes of host hostID, of a fleet.
func (p *Plane) ResyncHost(ctx context.Context, hostID string, list func(context.Context) ([]host.Info, error)) error {
	h, err := p.on(hostID)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	live, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: hostID, States: LiveStates})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	infos, err := list(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list host sandboxes: %w", err)
	}
	alive := map[string]lifecycle.State{}
	unsettled := false
	for _, info := range infos {
		alive[info.ID] = info.State
		// An operation an earlier server started (a snapshot, a fork) may
		// still finish on the host: what it makes (a snapshot to record)
		// appears after this resync, so the TTL loop resyncs again.
		unsettled = unsettled || (info.Busy && !p.isBusy(info.ID))
	}
	defer func() {
		p.mu.Lock()
		delete(p.resyncAgain, hostID)
		if unsettled {
			p.resyncAgain[hostID] = list
		}
		p.mu.Unlock()
	}()
	known := map[string]bool{}
	for _, sb := range live {
		known[sb.ID] = true
		if p.isBusy(sb.ID) {
			continue
		}
		st, ok := alive[sb.ID]
		update, inFlight := p.resyncUpdate(ctx, h, sb, st, ok)
		if inFlight {
			unsettled = true
		}
		if update == nil {
			continue
		}
		if err := p.updateUnchanged(ctx, sb, update); err != nil {
			return fmt.Errorf("reconcile %s: %w", sb.ID, err)
		}
	}
	p.killStrangers(ctx, h, hostID, alive, known)
	p.resyncSnapshots(ctx, hostID, h)
	return nil
}

// resyncUpdate decides what live record sb must become given the host's
// sandbox of its id (onHost: the host has one, in state st), as Resync
// lists, and kills the host's sandbox where the record ends. It returns
// the update to make, nil for none; inFlight when an operation is still
// running on the host that no request of this server waits for (an
// earlier server started it): the TTL loop resyncs again until it ends.
func (p *Plane) resyncUpdate(ctx context.Context, h host.Host, sb catalog.Sandbox, st lifecycle.State, onHost bool) (update func(x *catalog.Sandbox) error, inFlight bool) {
	settled := onHost && (st == lifecycle.Running || st == lifecycle.Paused)
	switch {
	case onHost && !settled:
		return nil, true
	case sb.State == catalog.StateStopping:
		if onHost {
			h.Kill(ctx, sb.ID)
		}
		reason := sb.StopReason // recorded as the stop began
		if reason == "" {
			reason = "killed"
		}
		return p.stoppedBy(reason), false
	case settled && sb.State == string(st):
		return nil, false
	case settled && sb.State != catalog.StateStarting:
		p.log.Info("sandbox state from its host", "sandbox_id", sb.ID, "state", st, "recorded", sb.State)
		return p.settledAs(st), false
	default:
		if onHost {
			h.Kill(ctx, sb.ID) // a create that never finished
		}
		reason := "vmm_exited"
		if sb.State == catalog.StateStarting {
			reason = "host_restarted"
		}
		return p.stoppedBy(reason), false
	}
}

// settledAs is the update of a record to the settled state st its host
// has: a pause or resume that a crash interrupted ends as the host
// finished or rolled it back (a resume rolled back says so in
// last_error); a paused sandbox does not expire, a running one does.
func (p *Plane) settledAs(st lifecycle.State) func(x *catalog.Sandbox) error {
	return func(x *catalog.Sandbox) error {
		if x.State == catalog.StateResuming && st == lifecycle.Paused {
			x.LastError = "resume failed: interrupted by a restart; resume it again"
		}
		if x.State == catalog.StatePausing && st == lifecycle.Running {
			x.LastError = "pause failed: interrupted by a restart; the sandbox runs on"
		}
		x.State = string(st)
		if st == lifecycle.Paused {
			x.ExpiresAt = time.Time{}
		} else if x.ExpiresAt.IsZero() {
			x.ExpiresAt = p.now().Add(p.ttlOf(*x))
		}
		if st == lifecycle.Running {
			x.PausedBytes = 0
		}
		return nil
	}
}

// updateUnchanged applies update to record sb unless the record changed
// since sb was read or is gone: then it does nothing.
func (p *Plane) updateUnchanged(ctx context.Context, sb catalog.Sandbox, update func(x *catalog.Sandbox) error) error {
	_, err := p.cat.UpdateSandbox(ctx, sb.ID, func(x *catalog.Sandbox) error {
		if x.State != sb.State || !x.UpdatedAt.Equal(sb.UpdatedAt) {
			return errChanged
		}
		if err := update(x); err != nil {
			return err
		}
		x.UpdatedAt = p.now()
		return nil
	})
	if errors.Is(err, errChanged) || errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	return err
}

// killStrangers kills each sandbox host h (hostID) has (alive) that the
// catalog does not list live there (known: the live records read), unless
// it is busy or its record appeared since the catalog was read.
func (p *Plane) killStrangers(ctx context.Context, h host.Host, hostID string, alive map[string]lifecycle.State, known map[string]bool) {
	for id := range alive {
		if known[id] || p.isBusy(id) {
			continue
		}
		// Created since the catalog was read? (Not a sandbox that moved
		// to another host while this one was away: its copy here is
		// stale, and killing it leaves the new host's alone.)
		if sb, err := p.cat.GetSandbox(ctx, id); err == nil && sb.State != catalog.StateStopped && sb.HostID == hostID {
			continue
		}
		p.log.Warn("killing a sandbox the catalog does not place on this host (a create that never finished, or a copy of one that moved)", "sandbox_id", id, "host_id", hostID)
		h.Kill(ctx, id)
	}
}

func (p *Plane) stoppedBy(reason string) func(x *catalog.Sandbox) error {
	return func(x *catalog.Sandbox) error {
		x.State, x.StopReason, x.StoppedAt, x.PausedBytes = catalog.StateStopped, reason, p.now(), 0
		return nil
	}
}

// resyncSnapshots records the host's snapshots the catalog does not know,
// for the key that owns the sandbox they were taken from (a crash between
// the host's snapshot and its record), and forgets the records of
// snapshots the host no longer has (a crash between the host's delete and
// the record's).
func (p *Plane) resyncSnapshots(ctx context.Context, hostID string, h host.Host) {
	sl, ok := h.(host.SnapshotLister)
	if !ok {
		return
	}
	// Records first: a snapshot is on its host before it is recorded, so
	// one recorded after this list is not mistaken for one deleted.
	recs, err := p.cat.ListSnapshots(ctx, "")
	if err != nil {
		p.log.Warn("reconcile snapshots: list records", "err", err)
		return
	}
	snaps, err := sl.Snapshots(ctx)
	if err != nil {
		p.log.Warn("reconcile snapshots: list host snapshots", "err", err)
		return
	}
	have := map[string]bool{}
	for _, si := range snaps {
		have[si.ID] = true
	}
	for _, sn := range recs {
		if sn.HostID != hostID || have[sn.ID] {
			continue
		}
		if err := p.cat.DeleteSnapshot(ctx, sn.ID); err != nil && !errors.Is(err, catalog.ErrNotFound) {
			p.log.Warn("forget a snapshot its host no longer has", "snapshot_id", sn.ID, "err", err)
			continue
		}
		p.log.Info("forgot a snapshot whose delete a restart interrupted", "snapshot_id", sn.ID, "key_id", sn.KeyID)
	}
	for _, si := range snaps {
		if si.SandboxID == "" {
			continue // unreadable metadata: nothing to record it with
		}
		if si.Transient {
			continue // a cross-host fork's capture, no one's snapshot: its host deletes it
		}
		if _, err := p.cat.GetSnapshot(ctx, si.ID); !errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if p.isBusy(si.SandboxID) {
			continue // a snapshot of this server's own in flight: its request records it
		}
		from, err := p.cat.GetSandbox(ctx, si.SandboxID)
		if err != nil {
			p.log.Warn("snapshot on the host has no known owner; leaving it", "snapshot_id", si.ID, "sandbox_id", si.SandboxID)
			continue
		}
		sn := catalog.Snapshot{ID: si.ID, KeyID: from.KeyID, SandboxID: si.SandboxID, HostID: from.HostID,
			Template: from.Template, MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs, SizeBytes: si.SizeBytes, CreatedAt: si.CreatedAt}
		if err := p.cat.CreateSnapshot(ctx, sn, catalog.Limits{}); err != nil && !errors.Is(err, catalog.ErrConflict) {
			p.log.Warn("record snapshot found on the host", "snapshot_id", si.ID, "err", err)
			continue
		}
		p.log.Info("recorded a snapshot a restart left unrecorded", "snapshot_id", si.ID, "key_id", from.KeyID)
	}
}

// resyncRetry is how often the TTL loop resyncs records that the last
// Resync left unsettled.
const resyncRetry = time.Second

// Run enforces TTLs (a running sandbox past its expiry is stopped, or
// paused if it asked for that, within a few hundred milliseconds; paused
// sandboxes never expire), settles records that Resync left in the middle
// of an operation on their host once it ends, and forgets long-stopped
// sandboxes, until ctx ends.
func (p *Plane) Run(ctx context.Context) error {
	ticks := p.cfg.Tick
	if ticks == nil {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		ticks = tick.C
	}
	lastPurge, lastResync := p.clock(), p.clock()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticks:
		}
		p.mu.Lock()
		again := maps.Clone(p.resyncAgain)
		p.mu.Unlock()
		if len(again) > 0 && p.clock().Sub(lastResync) >= resyncRetry {
			lastResync = p.clock()
			for hostID, list := range again {
				if err := p.ResyncHost(ctx, hostID, list); err != nil && ctx.Err() == nil {
					p.log.Warn("resync records left in the middle of an operation", "host_id", hostID, "err", err)
				}
			}
		}
		now := p.now()
		due, err := p.cat.Due(ctx, now)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Error("list expired sandboxes", "err", err)
			}
			continue
		}
		for _, sb := range due {
			// Only running sandboxes expire (and stopping ones whose
			// stop could not reach their host are retried).
			if sb.State != catalog.StateRunning && sb.State != catalog.StateStopping {
				continue
			}
			p.mu.Lock()
			busy := p.busy[sb.ID] > 0
			if !busy {
				p.busy[sb.ID]++
			}
			p.mu.Unlock()
			if busy {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer p.setBusy(sb.ID, false)
				p.expire(ctx, sb)
			}()
		}
		if p.clock().Sub(lastPurge) > time.Minute {
			lastPurge = p.clock()
			if _, err := p.cat.PurgeStopped(ctx, now.Add(-p.cfg.StoppedRetention)); err != nil && ctx.Err() == nil {
				p.log.Error("purge stopped sandboxes", "err", err)
			}
		}
	}
}

// expire ends a sandbox whose TTL ran out: paused if it asked for that
// (and the pause works), else stopped.
func (p *Plane) expire(ctx context.Context, sb catalog.Sandbox) {
	if sb.OnExpire == "pause" && sb.State == catalog.StateRunning {
		if _, err := p.on(sb.HostID); errors.Is(err, ErrHostLost) {
			return // not even tried (each try is two records and events) until the host is back
		}
		o, err := p.pause(sb.ID)
		var perr error
		if err == nil {
			_, _, perr = o.wait(ctx)
		}
		if err == nil && perr == nil {
			p.metrics.expired.Inc()
			return
		}
		if ctx.Err() != nil {
			return
		}
		if err := errors.Join(err, perr); errors.Is(err, host.ErrUnavailable) { // ErrHostLost too
			// Its host cannot be reached (lost, or restarting): the
			// sandbox may well be running there still, and a kill would
			// lose what the pause was asked to keep. Retried every tick
			// until the host is back (a kill by its owner still works).
			p.log.Debug("pause expired sandbox: its host is unavailable; retried", "sandbox_id", sb.ID, "err", err)
			return
		}
		p.log.Error("pause expired sandbox; killing it instead", "sandbox_id", sb.ID, "err", errors.Join(err, perr))
	}
	if err := p.Stop(ctx, sb.ID, "expired"); err != nil {
		if errors.Is(err, host.ErrUnavailable) {
			// Retried every tick until the host is back; its absence is
			// logged where it is noticed.
			p.log.Debug("expire sandbox", "sandbox_id", sb.ID, "err", err)
			return
		}
		p.log.Error("expire sandbox", "sandbox_id", sb.ID, "err", err)
		return
	}
	p.metrics.expired.Inc()
}
