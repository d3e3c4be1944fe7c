package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Router is the fleet as one host.Host for the REST API's handlers, which
// reach sandboxes by id (exec, files, processes, the port proxy): each
// call goes to the host the sandbox's record names. Calls without a
// sandbox (templates, the accelerator) go to the first ready host; List
// and Snapshots cover every reachable host. The control plane itself does
// not use it: it places sandboxes and calls their hosts directly.
type Router struct {
	reg *Registry
	cat catalog.Catalog
}

// NewRouter returns the router of reg's hosts.
func NewRouter(reg *Registry, cat catalog.Catalog) *Router { return &Router{reg: reg, cat: cat} }

var (
	_ host.Host           = (*Router)(nil)
	_ host.GuestDialer    = (*Router)(nil)
	_ host.SnapshotLister = (*Router)(nil)
)

// of returns the host of sandbox id.
func (rt *Router) of(ctx context.Context, id string) (host.Host, error) {
	sb, err := rt.cat.GetSandbox(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, fmt.Errorf("sandbox %s: %w", id, host.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	h, err := rt.reg.Host(sb.HostID)
	if errors.Is(err, controlplane.ErrHostLost) {
		return nil, &controlplane.Error{Kind: controlplane.Unavailable, Err: err, Msg: fmt.Sprintf(
			"sandbox %s is lost: its host %s stopped heartbeating; it is back as it was if the host returns (kill it to free its quota)", id, sb.HostID)}
	}
	return h, err
}

// first returns the first ready host.
func (rt *Router) first() (host.Host, error) {
	for _, st := range rt.reg.Statuses() {
		if st.Connected && st.Record.State != catalog.HostLost {
			if h, err := rt.reg.Host(st.Record.ID); err == nil {
				return h, nil
			}
		}
	}
	return nil, fmt.Errorf("no host is connected: %w", host.ErrUnavailable)
}

func (rt *Router) Create(ctx context.Context, req host.CreateRequest) (host.Info, error) {
	return host.Info{}, errors.New("fleet router: creates are placed by the control plane")
}

func (rt *Router) Kill(ctx context.Context, id string) error {
	h, err := rt.of(ctx, id)
	if err != nil {
		return err
	}
	return h.Kill(ctx, id)
}

func (rt *Router) Get(ctx context.Context, id string) (host.Info, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.Info{}, err
	}
	return h.Get(ctx, id)
}

func (rt *Router) List(ctx context.Context) ([]host.Info, error) {
	var out []host.Info
	for _, st := range rt.reg.Statuses() {
		h, err := rt.reg.Host(st.Record.ID)
		if err != nil {
			continue
		}
		list, err := h.List(ctx)
		if err != nil {
			continue
		}
		out = append(out, list...)
	}
	return out, nil
}

func (rt *Router) Guest(ctx context.Context, id string) (host.Guest, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return nil, err
	}
	return h.Guest(ctx, id)
}

func (rt *Router) Memory(ctx context.Context, id string) (host.MemStats, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.MemStats{}, err
	}
	return h.Memory(ctx, id)
}

func (rt *Router) Templates() host.Templates { return routerTemplates{rt} }

func (rt *Router) TemplateParams(name string, memoryMiB, vcpus int) templates.Params {
	if h, err := rt.first(); err == nil {
		return h.TemplateParams(name, memoryMiB, vcpus)
	}
	return templates.Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
}

func (rt *Router) Accel() accel.Accel {
	if h, err := rt.first(); err == nil {
		return h.Accel()
	}
	return ""
}

func (rt *Router) Fork(ctx context.Context, id string, childIDs []string) (host.ForkResult, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.ForkResult{}, err
	}
	return h.Fork(ctx, id, childIDs)
}

func (rt *Router) Snapshot(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.SnapshotInfo{}, err
	}
	return h.Snapshot(ctx, id, snapshotID)
}

func (rt *Router) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	sn, err := rt.cat.GetSnapshot(ctx, snapshotID)
	if errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("snapshot %s: %w", snapshotID, host.ErrNotFound)
	}
	if err != nil {
		return err
	}
	h, err := rt.reg.Host(sn.HostID)
	if err != nil {
		return err
	}
	return h.DeleteSnapshot(ctx, snapshotID)
}

func (rt *Router) Pause(ctx context.Context, id string) (host.CaptureStats, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.CaptureStats{}, err
	}
	return h.Pause(ctx, id)
}

func (rt *Router) Resume(ctx context.Context, id string) (host.Info, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return host.Info{}, err
	}
	return h.Resume(ctx, id)
}

func (rt *Router) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	h, err := rt.of(ctx, id)
	if err != nil {
		return err
	}
	return h.SetNetwork(ctx, id, p)
}

// DialGuest implements host.GuestDialer through the sandbox's host.
func (rt *Router) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	h, err := rt.of(ctx, id)
	if err != nil {
		return nil, err
	}
	d, ok := h.(host.GuestDialer)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return d.DialGuest(ctx, id, port)
}

// Snapshots implements host.SnapshotLister over every reachable host.
func (rt *Router) Snapshots(ctx context.Context) ([]host.SnapshotInfo, error) {
	var out []host.SnapshotInfo
	for _, st := range rt.reg.Statuses() {
		h, err := rt.reg.Host(st.Record.ID)
		if err != nil {
			continue
		}
		if sl, ok := h.(host.SnapshotLister); ok {
			if list, err := sl.Snapshots(ctx); err == nil {
				out = append(out, list...)
			}
		}
	}
	return out, nil
}

// routerTemplates is the fleet's templates as one store, for the API's
// template listing: a template is baked if any host holds it (each host
// bakes, or fetches from the object store, what its creates need), and a
// bake goes to the first ready host. Placement finds each create's
// template on the host it chooses, not here.
type routerTemplates struct{ rt *Router }

func (t routerTemplates) store() (host.Templates, error) {
	h, err := t.rt.first()
	if err != nil {
		return nil, err
	}
	return h.Templates(), nil
}

// stores are the template stores of the hosts that are connected and not
// lost, in host id order; an error if there is none.
func (t routerTemplates) stores() ([]host.Templates, error) {
	var out []host.Templates
	for _, st := range t.rt.reg.Statuses() {
		if st.Connected && st.Record.State != catalog.HostLost {
			if h, err := t.rt.reg.Host(st.Record.ID); err == nil {
				out = append(out, h.Templates())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no host is connected: %w", host.ErrUnavailable)
	}
	return out, nil
}

// Lookup answers as the first host that holds p baked and fresh, else as
// the first that holds it stale, else as the first host.
func (t routerTemplates) Lookup(ctx context.Context, p templates.Params) (*templates.Meta, string, error) {
	ss, err := t.stores()
	if err != nil {
		return nil, "", err
	}
	var (
		t1      *templates.Meta
		reason1 string
		err1    error
	)
	for i, s := range ss {
		tp, reason, err := s.Lookup(ctx, p)
		baked := err == nil && tp != nil
		if baked && reason == "" {
			return tp, "", nil
		}
		if i == 0 || (baked && (err1 != nil || t1 == nil)) { // the first answer, or the first stale bake
			t1, reason1, err1 = tp, reason, err
		}
	}
	return t1, reason1, err1
}

// eachStore calls f with every store; the hosts that cannot answer (f
// fails) are left out, unless none can: then the first error.
func (t routerTemplates) eachStore(f func(host.Templates) error) error {
	ss, err := t.stores()
	if err != nil {
		return err
	}
	var firstErr error
	answered := false
	for _, s := range ss {
		if err := f(s); err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		answered = true
	}
	if !answered {
		return firstErr
	}
	return nil
}

// List lists the templates baked on any host, each shape once (the most
// recent bake).
func (t routerTemplates) List(ctx context.Context) ([]templates.Meta, error) {
	byKey := map[string]templates.Meta{}
	err := t.eachStore(func(s host.Templates) error {
		ts, err := s.List(ctx)
		for _, tp := range ts {
			if old, ok := byKey[tp.Key()]; !ok || tp.BakedAt.After(old.BakedAt) {
				byKey[tp.Key()] = tp
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	out := slices.Collect(maps.Values(byKey))
	slices.SortFunc(out, func(a, b templates.Meta) int { return strings.Compare(a.Key(), b.Key()) })
	return out, nil
}

// Names lists the template names any host knows.
func (t routerTemplates) Names(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	err := t.eachStore(func(s host.Templates) error {
		ns, err := s.Names(ctx)
		for _, n := range ns {
			seen[n] = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return slices.Sorted(maps.Keys(seen)), nil
}

func (t routerTemplates) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error) {
	s, err := t.store()
	if err != nil {
		return nil, err
	}
	return s.Bake(ctx, p, progress)
}
