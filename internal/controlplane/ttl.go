package controlplane

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// ttlOf is a sandbox's TTL.
func (p *Plane) ttlOf(sb catalog.Sandbox) time.Duration {
	if ttl := time.Duration(sb.TTLSeconds) * time.Second; ttl > 0 {
		return ttl
	}
	return p.cfg.DefaultTTL
}

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
