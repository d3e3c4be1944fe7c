package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// Migrated is one sandbox a drain tried to move.
type Migrated struct {
	SandboxID string `json:"sandbox_id"`
	To        string `json:"to,omitempty"`
	Error     string `json:"error,omitempty"`
}

// Migrate moves the running sandboxes of host hostID to other hosts, one
// at a time (MoveTo). A sandbox that cannot move runs on where it was and
// is reported. Paused sandboxes stay recorded on their host: they resume
// elsewhere, from the object store, if it is lost.
func (p *Plane) Migrate(ctx context.Context, hostID string) (moved, failed []Migrated) {
	ctx = context.WithoutCancel(ctx)
	live, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: hostID, States: []string{catalog.StateRunning}})
	if err != nil {
		return nil, []Migrated{{Error: err.Error()}}
	}
	moved, failed = []Migrated{}, []Migrated{}
	for _, sb := range live {
		to, err := p.MoveTo(ctx, sb.ID)
		if err != nil {
			failed = append(failed, Migrated{SandboxID: sb.ID, Error: Classify(err).Msg})
			p.log.Warn("migrate sandbox", "sandbox_id", sb.ID, "from", hostID, "err", err)
			continue
		}
		moved = append(moved, Migrated{SandboxID: sb.ID, To: to})
	}
	return moved, failed
}

// placeElsewhere chooses a host other than sb's for it. A sandbox that
// mounts volumes has none: it runs where its volumes are.
func (p *Plane) placeElsewhere(ctx context.Context, sb catalog.Sandbox) (scheduler.Choice, error) {
	if len(sb.Volumes) > 0 {
		return scheduler.Choice{}, Errorf(Conflict, "sandbox %s mounts volumes of host %s: it runs there only", sb.ID, sb.HostID)
	}
	var others []scheduler.Host
	for _, h := range p.fleet.Inventory(ctx) {
		if h.ID != sb.HostID {
			others = append(others, h)
		}
	}
	cs, err := scheduler.Place(scheduler.Request{Template: sb.Template, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs}, others)
	if err != nil {
		return scheduler.Choice{}, &Error{Kind: Conflict, Msg: "no other host can take it: " + err.Error(), Err: err}
	}
	return cs[0], nil
}

// onDrainingHost reports whether sandbox id is on a host that is
// draining.
func (p *Plane) onDrainingHost(ctx context.Context, id string) bool {
	sb, err := p.cat.GetSandbox(ctx, id)
	return err == nil && p.fleet.HostState(sb.HostID) == scheduler.Draining
}

// MoveTo moves running sandbox id to another host (the scheduler's choice
// among the others): paused on its host, its capture made durable in the
// object store, resumed on the new host, which fetches it; then its old
// host forgets it. If the move fails after the pause, it is resumed on its
// old host. Returns the new host.
func (p *Plane) MoveTo(ctx context.Context, id string) (string, error) {
	sb, err := p.cat.GetSandbox(ctx, id)
	if err != nil {
		return "", err
	}
	if sb.State != catalog.StateRunning {
		return "", Errorf(Conflict, "sandbox %s is %s", id, sb.State)
	}
	src, err := p.on(sb.HostID)
	if err != nil {
		return "", err
	}
	// Choose before pausing: no host to go to, no pause.
	choice, err := p.placeElsewhere(ctx, sb)
	if err != nil {
		return "", err
	}
	to := choice.Host
	o, err := p.pause(id)
	if err != nil {
		return "", err
	}
	if _, _, err := o.wait(ctx); err != nil {
		return "", err
	}
	err = p.awaitPausedDurable(ctx, src, sb.HostID, id)
	if err == nil {
		if o, err = p.resumeOn(id, to); err == nil {
			_, _, err = o.wait(ctx)
		}
	}
	if err != nil {
		if o, rerr := p.resumeOn(id, sb.HostID); rerr == nil {
			o.wait(ctx)
		}
		return "", err
	}
	// A move is not a pause the user asked for: the TTL runs on as it was.
	if _, err := p.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		if x.State == catalog.StateRunning && sb.ExpiresAt.After(p.now()) {
			x.ExpiresAt = sb.ExpiresAt
		}
		return nil
	}); err != nil {
		p.log.Warn("keep a moved sandbox's expiry", "sandbox_id", id, "err", err)
	}
	p.log.Info("sandbox moved", "sandbox_id", id, "from", sb.HostID, "to", to, "reason", choice.Reason)
	// The old host forgets its paused copy.
	if err := src.Kill(ctx, id); err != nil && !errors.Is(err, host.ErrNotFound) {
		p.log.Warn("remove a moved sandbox from its old host", "sandbox_id", id, "host_id", sb.HostID, "err", err)
	}
	return to, nil
}

// awaitPausedDurable waits until host h's paused sandbox id is durable in
// the object store (host.Info.Stored).
func (p *Plane) awaitPausedDurable(ctx context.Context, h host.Host, hostID, id string) error {
	ctx, cancel := context.WithTimeout(ctx, acrossTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	t0 := time.Now()
	for {
		info, err := h.Get(ctx, id)
		if err != nil {
			return err
		}
		if info.State != lifecycle.Paused {
			return Errorf(Conflict, "sandbox %s is %s on its host", id, info.State)
		}
		switch info.Stored {
		case host.StoredDurable:
			return nil
		case host.StoredLocal, "":
			return Errorf(Invalid, "host %s has no object store: a sandbox can move to another host only when the hosts share one (panda agent --store)", hostID)
		}
		if info.StoreError != "" && time.Since(t0) > p.storeDownAfter() {
			return storeDown(info.StoreError)
		}
		select {
		case <-ctx.Done():
			if info.StoreError != "" {
				return storeDown(info.StoreError)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// ResumeOn resumes paused sandbox id on the host pl asks for (zero: as
// Resume, its own host). On another host, once its capture is durable in
// the object store, the new host fetches it and resumes it, and the old
// host forgets its copy; the record names the new host.
//
// Without a placement, a sandbox whose host is draining resumes on the
// host the scheduler picks among the others (a drain empties its host),
// unless none can take it or the hosts share no object store: then on its
// own host, as before the drain.
func (p *Plane) ResumeOn(ctx context.Context, id string, pl scheduler.Placement) (catalog.Sandbox, error) {
	if pl.IsZero() && !p.onDrainingHost(ctx, id) {
		return p.Resume(ctx, id)
	}
	sb, err := p.cat.GetSandbox(ctx, id)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	if sb.State != catalog.StatePaused {
		return catalog.Sandbox{}, Errorf(Conflict, "sandbox %s is %s, not paused", id, sb.State)
	}
	var cs []scheduler.Choice
	if pl.IsZero() {
		c, err := p.placeElsewhere(ctx, sb)
		if err != nil {
			p.log.Info("resume on its draining host: no other host takes it", "sandbox_id", id, "host_id", sb.HostID, "err", err)
			return p.Resume(ctx, id)
		}
		c.Reason = fmt.Sprintf("host %s is draining; %s", sb.HostID, c.Reason)
		cs = []scheduler.Choice{c}
	} else if len(sb.Volumes) > 0 && forkPlacement(sb, pl) != nil {
		return catalog.Sandbox{}, forkPlacement(sb, pl)
	} else if cs, err = p.place(ctx, scheduler.Request{Template: sb.Template, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
		ParentHost: sb.HostID, Placement: pl}); err != nil {
		return catalog.Sandbox{}, err
	}
	to := cs[0].Host
	if to == sb.HostID {
		return p.Resume(ctx, id)
	}
	src, srcErr := p.on(sb.HostID)
	if srcErr == nil {
		// Its own host is up: wait for the capture to be in the store.
		if err := p.awaitPausedDurable(ctx, src, sb.HostID, id); err != nil {
			var e *Error
			if pl.IsZero() && errors.As(err, &e) && e.Kind == Invalid { // no store: it stays where it is
				return p.Resume(ctx, id)
			}
			return catalog.Sandbox{}, err
		}
	}
	o, err := p.resumeOn(id, to)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	out, _, err := o.wait(ctx)
	var sc *stateConflict
	if errors.As(err, &sc) {
		err = Errorf(Conflict, "sandbox %s is %s, not paused", sc.id, sc.state)
	}
	if err != nil {
		return out, err
	}
	p.log.Info("sandbox resumed on another host", "sandbox_id", id, "from", sb.HostID, "to", to, "reason", cs[0].Reason)
	if srcErr == nil {
		if err := src.Kill(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, host.ErrNotFound) {
			p.log.Warn("remove a moved sandbox from its old host", "sandbox_id", id, "host_id", sb.HostID, "err", err)
		}
	}
	return out, nil
}
