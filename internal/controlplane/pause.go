package controlplane

import (
	"context"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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

// Pause pauses running sandbox id and waits for it (a pause in flight is
// joined); the sandbox as the pause left it. If ctx ends first the pause
// goes on. A sandbox that is not running is a conflict.
func (p *Plane) Pause(ctx context.Context, id string) (catalog.Sandbox, error) {
	return p.waitOp(ctx, p.pause, id, catalog.StateRunning)
}
