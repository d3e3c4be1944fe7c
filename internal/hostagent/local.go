package hostagent

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
)

// Local is a as the control plane's host (host.Host), in this process:
// `panda up`, and the agent behind the host API of `panda agent`. The
// agent's own calls need no ctx where they do no waiting (Get, List,
// Memory, DeleteSnapshot, template lookups); Local takes one to meet the
// contract. It also dials guests (host.GuestDialer), lists snapshots
// (host.SnapshotLister), takes transient captures (host.Transferer) and
// hands snapshots straight to other hosts (host.DirectTransferer).
func Local(a *Agent) host.Host { return local{a} }

type local struct{ a *Agent }

var (
	_ host.Host             = local{}
	_ host.GuestDialer      = local{}
	_ host.SnapshotLister   = local{}
	_ host.Transferer       = local{}
	_ host.DirectTransferer = local{}
	_ host.PackCreator      = local{}
	_ host.ProcessGuest     = localGuest{}
	_ host.DirWatcher       = localGuest{}
	_ host.Templates        = localTemplates{}
)

func (h local) Create(ctx context.Context, req host.CreateRequest) (host.Info, error) {
	return h.a.Create(ctx, req)
}

func (h local) Kill(ctx context.Context, id string) error { return h.a.Kill(ctx, id) }

func (h local) Get(_ context.Context, id string) (host.Info, error) { return h.a.Get(id) }

func (h local) List(context.Context) ([]host.Info, error) { return h.a.List(), nil }

func (h local) Guest(_ context.Context, id string) (host.Guest, error) {
	c, err := h.a.Guest(id)
	if err != nil {
		return nil, err
	}
	return localGuest{c}, nil
}

func (h local) Memory(_ context.Context, id string) (host.MemStats, error) { return h.a.Memory(id) }

func (h local) Templates() host.Templates { return localTemplates{h.a.Templates()} }

func (h local) TemplateParams(name string, memoryMiB, vcpus int) templates.Params {
	return h.a.TemplateParams(name, memoryMiB, vcpus)
}

func (h local) Accel() accel.Accel { return h.a.Accel() }

// NetworkOff implements host.NetworkReporter.
func (h local) NetworkOff() bool { return h.a.NetworkOff() }

var _ host.NetworkReporter = local{}

func (h local) Fork(ctx context.Context, id string, childIDs []string) (host.ForkResult, error) {
	return h.a.Fork(ctx, id, childIDs)
}

func (h local) Snapshot(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	return contract(h.a.Snapshot(ctx, id, snapshotID))
}

func (h local) SnapshotTransient(ctx context.Context, id, snapshotID string) (host.SnapshotInfo, error) {
	return contract(h.a.SnapshotTransient(ctx, id, snapshotID))
}

func (h local) AwaitStored(ctx context.Context, snapshotID string, wait time.Duration) (host.SnapshotInfo, error) {
	return contract(h.a.AwaitStored(ctx, snapshotID, wait))
}

// SnapshotPack streams the pack through a pipe, written as it is read.
func (h local) SnapshotPack(ctx context.Context, snapshotID string) (io.ReadCloser, error) {
	if _, err := h.a.GetSnapshot(snapshotID); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := h.a.SendSnapshot(ctx, snapshotID, nil, pw)
		pw.CloseWithError(err) // nil: EOF
	}()
	return pr, nil
}

func (h local) ReceiveSnapshot(ctx context.Context, snapshotID string, r io.Reader) (host.SnapshotInfo, error) {
	return contract(h.a.ReceiveSnapshot(ctx, snapshotID, r))
}

func (h local) ReceiveAndCreate(ctx context.Context, req host.CreateRequest, r io.Reader) (host.Info, host.SnapshotInfo, error) {
	info, si, err := h.a.ReceiveAndCreate(ctx, req, r)
	return info, si.Contract(), err
}

func (h local) DeleteSnapshot(_ context.Context, snapshotID string) error {
	return h.a.DeleteSnapshot(snapshotID)
}

func (h local) Pause(ctx context.Context, id string) (host.CaptureStats, error) {
	return h.a.Pause(ctx, id)
}

func (h local) Resume(ctx context.Context, id string) (host.Info, error) { return h.a.Resume(ctx, id) }

func (h local) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error {
	return h.a.SetNetwork(ctx, id, p)
}

func (h local) DialGuest(ctx context.Context, id string, port int) (net.Conn, error) {
	return h.a.DialGuest(ctx, id, port)
}

func (h local) Snapshots(context.Context) ([]host.SnapshotInfo, error) {
	sis := h.a.Snapshots()
	out := make([]host.SnapshotInfo, len(sis))
	for i, si := range sis {
		out[i] = si.Contract()
	}
	return out, nil
}

// contract is an agent's answer about a snapshot as the contract's.
func contract(si SnapshotInfo, err error) (host.SnapshotInfo, error) { return si.Contract(), err }

// localTemplates is the agent's template store as host.Templates.
type localTemplates struct{ s *template.Store }

func (t localTemplates) Lookup(_ context.Context, p templates.Params) (*templates.Meta, string, error) {
	tp, reason, err := t.s.Lookup(p)
	return metaOf(tp), reason, err
}

func (t localTemplates) List(context.Context) ([]templates.Meta, error) {
	ts, err := t.s.List()
	out := make([]templates.Meta, len(ts))
	for i := range ts {
		out[i] = ts[i].Meta
	}
	return out, err
}

func (t localTemplates) Names(context.Context) ([]string, error) { return t.s.Names(), nil }

func (t localTemplates) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error) {
	tp, err := t.s.Bake(ctx, p, progress)
	return metaOf(tp), err
}

// metaOf is a baked template's description (nil for none).
func metaOf(t *template.Template) *templates.Meta {
	if t == nil {
		return nil
	}
	m := t.Meta
	return &m
}

// localGuest is a guest agent client as host.Guest.
type localGuest struct{ *guestproto.Client }

func (g localGuest) StartExec(ctx context.Context, req guestproto.ExecRequest) (host.Process, error) {
	p, err := g.Client.StartExec(ctx, req)
	if err != nil {
		return nil, err
	}
	return localProcess{p}, nil
}

type localProcess struct{ p *guestproto.Process }

func (p localProcess) PID() int                             { return p.p.PID }
func (p localProcess) Stdin() io.WriteCloser                { return p.p.Stdin }
func (p localProcess) Stdout() io.Reader                    { return p.p.Stdout }
func (p localProcess) Stderr() io.Reader                    { return p.p.Stderr }
func (p localProcess) Wait() (guestproto.ExecResult, error) { return p.p.Wait() }
