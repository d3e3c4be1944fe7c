package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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
