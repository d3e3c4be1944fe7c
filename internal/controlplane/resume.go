package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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
		if hostID != sb.HostID {
			// On another host: claimed until the record names it.
			release, err := p.claimHost(hostID)
			if err != nil {
				return p.failed(ctx, id, lifecycle.ResumeFailed, "resume", err)
			}
			defer release()
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

// Resume resumes paused sandbox id and waits for it, as Pause.
func (p *Plane) Resume(ctx context.Context, id string) (catalog.Sandbox, error) {
	return p.waitOp(ctx, p.resume, id, catalog.StatePaused)
}
