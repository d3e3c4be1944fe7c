package controlplane

import (
	"context"
	"errors"
	"hash/fnv"
	"reflect"
	"sync"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/events"
)

// Types of the events the plane publishes (Config.Events). Data is the
// record as written: a catalog.Sandbox for "sandbox" and
// "sandbox_deleted" (the stopped record, or the last one before its
// removal), a catalog.Snapshot for "snapshot" and "snapshot_deleted".
const (
	EventSandbox         = "sandbox"
	EventSandboxDeleted  = "sandbox_deleted"
	EventSnapshot        = "snapshot"
	EventSnapshotDeleted = "snapshot_deleted"
)

// publishing is the catalog the plane writes through: every write of a
// sandbox or snapshot record that succeeds is published to Config.Events
// for the record's key, and a sandbox that stops or whose record goes
// loses its command history. The plane writes records only through p.cat,
// so no change can be missed by forgetting a call; writes by another
// process sharing the catalog (PostgreSQL) are not seen.
//
// A sandbox that becomes stopped is published as "sandbox_deleted": the
// default list (GET /v1/sandboxes) no longer shows it. Writes of one
// record take a lock striped by id around the write and its publication,
// so that two concurrent updates of one sandbox are published in the
// order they were written. UpdateSandbox's fn must not call the catalog
// (its contract), so the locks never nest.
type publishing struct {
	catalog.Catalog
	p       *Plane
	stripes [64]sync.Mutex
}

func (c *publishing) lock(id string) func() {
	h := fnv.New32a()
	h.Write([]byte(id))
	m := &c.stripes[h.Sum32()%uint32(len(c.stripes))]
	m.Lock()
	return m.Unlock
}

func (c *publishing) ReserveSandbox(ctx context.Context, sb catalog.Sandbox, lim catalog.Limits) error {
	defer c.lock(sb.ID)()
	if err := c.Catalog.ReserveSandbox(ctx, sb, lim); err != nil {
		return err
	}
	c.publish(EventSandbox, sb.ID, sb.KeyID, sb)
	return nil
}

func (c *publishing) UpdateSandbox(ctx context.Context, id string, fn func(*catalog.Sandbox) error) (catalog.Sandbox, error) {
	defer c.lock(id)()
	var before catalog.Sandbox
	after, err := c.Catalog.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		before = *x
		return fn(x)
	})
	if err != nil || reflect.DeepEqual(before, after) {
		return after, err
	}
	switch {
	case after.State != catalog.StateStopped:
		c.publish(EventSandbox, id, after.KeyID, after)
	case before.State != catalog.StateStopped:
		c.p.commands.drop(id)
		c.publish(EventSandboxDeleted, id, after.KeyID, after)
	}
	return after, nil
}

func (c *publishing) DeleteSandbox(ctx context.Context, id string) error {
	defer c.lock(id)()
	old, gerr := c.Catalog.GetSandbox(ctx, id)
	if err := c.Catalog.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	c.p.commands.drop(id)
	if gerr == nil && old.State != catalog.StateStopped {
		c.publish(EventSandboxDeleted, id, old.KeyID, old)
	}
	return nil
}

func (c *publishing) CreateSnapshot(ctx context.Context, s catalog.Snapshot, lim catalog.Limits) error {
	if err := c.Catalog.CreateSnapshot(ctx, s, lim); err != nil {
		return err
	}
	c.publish(EventSnapshot, s.ID, s.KeyID, s)
	return nil
}

func (c *publishing) DeleteSnapshot(ctx context.Context, id string) error {
	old, gerr := c.Catalog.GetSnapshot(ctx, id)
	if err := c.Catalog.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	if gerr == nil {
		c.publish(EventSnapshotDeleted, id, old.KeyID, old)
	} else if !errors.Is(gerr, catalog.ErrNotFound) {
		c.p.log.Warn("snapshot deleted without its event", "snapshot_id", id, "err", gerr)
	}
	return nil
}

func (c *publishing) publish(typ, id, key string, data any) {
	c.p.cfg.Events.Publish(events.Event{Type: typ, ID: id, Key: key, Data: data})
}
