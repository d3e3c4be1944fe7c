package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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
