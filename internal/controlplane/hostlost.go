package controlplane

import (
	"context"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/events"
)

// HostLostChanged tells the event streams that host hostID was lost or
// came back: each live sandbox on it is published again. The records
// themselves do not change; the API shows a sandbox whose host is lost as
// "lost". The fleet's registry calls it (fleet.Hooks.LostChanged).
func (p *Plane) HostLostChanged(ctx context.Context, hostID string) {
	list, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: hostID, States: LiveStates})
	if err != nil {
		p.log.Warn("list the sandboxes of a lost host for events", "host_id", hostID, "err", err)
		return
	}
	for _, sb := range list {
		p.cfg.Events.Publish(events.Event{Type: EventSandbox, ID: sb.ID, Key: sb.KeyID, Data: sb})
	}
}
