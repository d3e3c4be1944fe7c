package controlplane

import (
	"context"
	"errors"
	"fmt"

	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// The machinery of a sandbox's lifecycle on the control plane (see
// Plane): state transitions through the lifecycle table, and operations
// detached from the request that asked for them, one per sandbox at a
// time. The operations are in files of their own: create.go, stop.go,
// pause.go, resume.go, fork.go, snapshot.go, reconcile.go (with the
// hosts), ttl.go (the TTL loop).

// transition applies ev to sandbox id's record and then mut, in one catalog
// transaction. A sandbox in a state where ev cannot happen is a conflict
// naming its state. It completes even if ctx is canceled.
func (p *Plane) transition(ctx context.Context, id string, ev lifecycle.Event, mut func(*catalog.Sandbox)) (catalog.Sandbox, error) {
	return p.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
		next, err := lifecycle.Next(lifecycle.State(x.State), ev)
		if err != nil {
			return &stateConflict{id: x.ID, state: x.State, ev: ev}
		}
		x.State = string(next)
		x.UpdatedAt = p.now()
		if mut != nil {
			mut(x)
		}
		return nil
	})
}

// stateConflict is a transition the record's state does not allow.
type stateConflict struct {
	id, state string
	ev        lifecycle.Event
}

func (e *stateConflict) Error() string {
	return fmt.Sprintf("sandbox %s is %s: cannot %s", e.id, e.state, e.ev)
}

// op is one long operation on a sandbox, running detached from requests.
type op struct {
	kind string
	done chan struct{}
	sb   catalog.Sandbox // the record as the operation left it
	val  any             // the operation's own result (capture stats, a snapshot, fork children)
	err  error
}

// wait returns the operation's outcome, or ctx's error if ctx ends first
// (the operation goes on).
func (o *op) wait(ctx context.Context) (catalog.Sandbox, any, error) {
	select {
	case <-o.done:
		return o.sb, o.val, o.err
	case <-ctx.Done():
		return catalog.Sandbox{}, nil, ctx.Err()
	}
}

// detach runs fn as operation kind on sandbox id, detached from the
// request: fn gets the plane's own context, canceled only when the server
// shuts down. A request for the same kind while one runs joins it (a
// client retrying a resume waits for the first); another kind is a
// conflict. The sandbox is busy meanwhile: Resync and the TTL loop leave
// it alone.
func (p *Plane) detach(id, kind string, fn func(ctx context.Context) (catalog.Sandbox, any, error)) (*op, error) {
	p.mu.Lock()
	if o, ok := p.ops[id]; ok {
		p.mu.Unlock()
		if o.kind == kind {
			return o, nil
		}
		return nil, Errorf(Conflict, "sandbox %s is busy: a %s is in progress", id, o.kind)
	}
	if p.closing {
		p.mu.Unlock()
		return nil, Errorf(Unavailable, "the server is shutting down")
	}
	o := &op{kind: kind, done: make(chan struct{})}
	p.ops[id] = o
	p.busy[id]++
	p.opsWG.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.opsWG.Done()
		o.sb, o.val, o.err = fn(p.life)
		p.mu.Lock()
		delete(p.ops, id)
		p.decBusy(id)
		p.mu.Unlock()
		close(o.done)
	}()
	return o, nil
}

// background runs fn, the tail of an operation that its caller need not
// wait for, in a goroutine that Shutdown waits for. Only from within an
// operation (detach's fn): opsWG is above zero then, so Shutdown's wait
// cannot have ended.
func (p *Plane) background(fn func()) {
	p.opsWG.Add(1)
	p.tailsWG.Add(1)
	go func() {
		defer p.opsWG.Done()
		defer p.tailsWG.Done()
		fn()
	}()
}

// Shutdown cancels the operations in flight (on the host they roll back:
// a resume leaves the sandbox paused, a pause leaves it running) and waits
// for them, at most until ctx ends; later ones are refused (unavailable).
// Requests must have stopped first.
func (p *Plane) Shutdown(ctx context.Context) {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.stopLife()
	done := make(chan struct{})
	go func() { p.opsWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		p.log.Warn("operations still running at shutdown")
	}
}

// setBusy marks a sandbox busy (counted: create, TTL expiry and
// operations may overlap) or releases one mark.
func (p *Plane) setBusy(id string, busy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if busy {
		p.busy[id]++
	} else {
		p.decBusy(id)
	}
}

// decBusy releases one busy mark. Called with p.mu held.
func (p *Plane) decBusy(id string) {
	if p.busy[id]--; p.busy[id] <= 0 {
		delete(p.busy, id)
	}
}

func (p *Plane) isBusy(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[id] > 0
}

// waitOp runs pause or resume (run) on sandbox id and waits; a state the
// operation does not start from (from) is a conflict.
func (p *Plane) waitOp(ctx context.Context, run func(id string) (*op, error), id, from string) (catalog.Sandbox, error) {
	o, err := run(id)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	sb, _, err := o.wait(ctx)
	var sc *stateConflict
	if errors.As(err, &sc) {
		err = Errorf(Conflict, "sandbox %s is %s, not %s", sc.id, sc.state, from)
	}
	return sb, err
}
