package chaos

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// The operations the suite runs through the REST API.
const (
	opCreate         = "create"
	opCreateSnapshot = "create_from_snapshot"
	opExec           = "exec"
	opWrite          = "write"
	opFork           = "fork"
	opSnapshot       = "snapshot"
	opDeleteSnapshot = "delete_snapshot"
	opPause          = "pause"
	opResume         = "resume"
	opKill           = "kill"
	opTTL            = "ttl"
)

// opWeights is the mix of operations (relative weights). An operation
// with no possible target this iteration is not picked.
var opWeights = []struct {
	kind   string
	weight int
}{
	{opCreate, 10}, {opCreateSnapshot, 4}, {opExec, 10}, {opWrite, 12}, {opFork, 5}, {opSnapshot, 5},
	{opDeleteSnapshot, 2}, {opPause, 9}, {opResume, 9}, {opKill, 5}, {opTTL, 3}, {opVolWrite, 8},
}

// soakOpWeights is the mix of a soak: churn of creates, execs, forks and
// kills, with short TTLs so that sandboxes also expire.
var soakOpWeights = []struct {
	kind   string
	weight int
}{
	{opCreate, 10}, {opCreateSnapshot, 1}, {opExec, 10}, {opWrite, 4}, {opFork, 6}, {opSnapshot, 1},
	{opDeleteSnapshot, 1}, {opPause, 2}, {opResume, 2}, {opKill, 8}, {opTTL, 6}, {opVolWrite, 3},
}

// longTTL is the TTL of the sandboxes the suite creates: they expire only
// when an operation sets a short one.
const longTTL = 12 * 3600

// maxFiles is how many files the suite keeps in one sandbox; further
// writes replace one.
const maxFiles = 6

// maxSnapshots is how many snapshots the suite keeps; beyond it, deleting
// one is likelier.
const maxSnapshots = 4

// op is one operation: planned by the run loop, run in its own goroutine,
// and its outcome applied to the model by the run loop.
type op struct {
	kind string
	n    int // number, unique in the run
	sb   *sbox
	snap *snapshot
	key  int // create: the key to use
	// What it needs, decided when planned (from the seed).
	count   int           // fork: children
	ttl     int           // ttl: seconds
	path    string        // write, exec: the file
	data    []byte        // write
	sum     string        // write, exec: its SHA-256
	markers []string      // create, fork: a marker token per new sandbox
	from    contents      // create from a snapshot, fork, snapshot: what the source held
	racer   bool          // a kill racing another operation on its sandbox
	delay   time.Duration // the racer: when it starts

	// Its outcome.
	err       error
	sandboxes []newSandbox // create, fork: made
	snapID    string       // snapshot
	bad       string       // an exec that answered wrong
}

// newSandbox is a sandbox an operation made, with whether its marker
// process started (markerErr nil) or may have.
type newSandbox struct {
	info      pandastack.SandboxInfo
	marker    string
	markerErr error
}

func (o *op) String() string {
	s := fmt.Sprintf("#%d %s", o.n, o.kind)
	switch {
	case o.sb != nil:
		s += " " + o.sb.id
	case o.snap != nil:
		s += " " + o.snap.id
	}
	switch o.kind {
	case opKill:
		if o.racer {
			s += fmt.Sprintf(" @%v", o.delay)
		}
	case opFork:
		s += fmt.Sprintf(" ×%d", o.count)
	case opTTL:
		s += fmt.Sprintf(" %ds", o.ttl)
	case opWrite, opVolWrite:
		s += fmt.Sprintf(" %s (%d bytes)", o.path, len(o.data))
	}
	return s
}

// killRaceRate is the probability that an iteration also kills a
// sandbox while another of its operations runs on it.
const killRaceRate = 0.1

// planOps picks n operations on distinct targets; want, if not "", is
// picked first if it has a target. Sometimes a kill of one of their
// sandboxes races them (it comes last: its outcome is applied last).
func (r *runner) planOps(n int, want string) []*op {
	var ops []*op
	room := r.cfg.MaxLive - len(r.m.live)
	for i := 0; i < n; i++ {
		kind := want
		if i > 0 || kind == "" || !r.possible(kind, room) {
			kind = r.pickKind(room)
		}
		if kind == "" {
			break
		}
		ops = append(ops, r.plan(kind, &room))
	}
	var racing []*op
	for _, o := range ops {
		if o.sb != nil && o.kind != opKill {
			racing = append(racing, o)
		}
	}
	if len(racing) > 0 && r.rng.Float64() < killRaceRate {
		x := racing[r.rng.IntN(len(racing))]
		r.opN++
		k := &op{kind: opKill, n: r.opN, sb: x.sb, racer: true, delay: time.Duration(r.rng.IntN(800)) * time.Millisecond}
		x.sb.killRace = true
		ops = append(ops, k)
	}
	return ops
}

// possible reports whether an operation of kind has a target now.
func (r *runner) possible(kind string, room int) bool {
	switch kind {
	case opCreate:
		return room > 0
	case opCreateSnapshot:
		return room > 0 && len(r.freeSnaps()) > 0
	case opDeleteSnapshot:
		return len(r.freeSnaps()) > 0
	case opFork:
		return room > 0 && len(r.free(stateRunning)) > 0
	case opResume:
		return len(r.free(statePaused)) > 0
	default:
		return len(r.free(stateRunning)) > 0
	}
}

func (r *runner) pickKind(room int) string {
	total := 0
	var kinds []string
	var weights []int
	table := opWeights
	if r.cfg.Soak > 0 {
		table = soakOpWeights
	}
	for _, w := range table {
		if !r.possible(w.kind, room) {
			continue
		}
		wt := w.weight
		if w.kind == opDeleteSnapshot && len(r.m.snaps) > maxSnapshots {
			wt *= 5
		}
		if w.kind == opSnapshot && len(r.m.snaps) > maxSnapshots {
			wt = 0
		}
		kinds, weights = append(kinds, w.kind), append(weights, wt)
		total += wt
	}
	if total == 0 {
		return ""
	}
	x := r.rng.IntN(total)
	for i, w := range weights {
		if x < w {
			return kinds[i]
		}
		x -= w
	}
	return ""
}

// free lists the sandboxes in state that no operation of this iteration
// targets yet, in a stable order.
func (r *runner) free(state string) []*sbox {
	var out []*sbox
	for _, id := range slices.Sorted(maps.Keys(r.m.live)) {
		if sb := r.m.live[id]; sb.state == state && !sb.busy {
			out = append(out, sb)
		}
	}
	return out
}

func (r *runner) freeSnaps() []*snapshot {
	var out []*snapshot
	for _, id := range slices.Sorted(maps.Keys(r.m.snaps)) {
		if sn := r.m.snaps[id]; !sn.busy {
			out = append(out, sn)
		}
	}
	return out
}

// plan makes an operation of kind with a target and its data; room is the
// number of sandboxes that may still be made.
func (r *runner) plan(kind string, room *int) *op {
	r.opN++
	o := &op{kind: kind, n: r.opN}
	pick := func(state string) *sbox {
		l := r.free(state)
		sb := l[r.rng.IntN(len(l))]
		sb.busy = true
		return sb
	}
	switch kind {
	case opCreate:
		o.key = r.rng.IntN(len(r.clients))
		o.from = contents{key: o.key, files: map[string]fileWant{}, markers: map[string]bool{}}
		o.markers = []string{r.marker()}
		*room--
	case opCreateSnapshot:
		l := r.freeSnaps()
		o.snap = l[r.rng.IntN(len(l))]
		o.snap.busy = true
		o.key = o.snap.key
		o.from = o.snap.contents.clone()
		o.from.shortTTL = false
		o.markers = []string{r.marker()}
		*room--
	case opDeleteSnapshot:
		l := r.freeSnaps()
		o.snap = l[r.rng.IntN(len(l))]
		o.snap.busy = true
		o.key = o.snap.key
	case opFork:
		o.sb = pick(stateRunning)
		o.count = 1 + r.rng.IntN(min(3, *room))
		*room -= o.count
		o.from = o.sb.contents.clone()
		for range o.count {
			o.markers = append(o.markers, r.marker())
		}
	case opSnapshot:
		o.sb = pick(stateRunning)
		o.from = o.sb.contents.clone()
	case opExec:
		o.sb = pick(stateRunning)
		var known []string
		for _, p := range slices.Sorted(maps.Keys(o.sb.files)) {
			if w := o.sb.files[p]; len(w.sums) == 1 && !w.maybeAbsent {
				known = append(known, p)
			}
		}
		if len(known) > 0 {
			o.path = known[r.rng.IntN(len(known))]
			for s := range o.sb.files[o.path].sums {
				o.sum = s
			}
		}
	case opWrite:
		o.sb = pick(stateRunning)
		if len(o.sb.files) >= maxFiles {
			l := slices.Sorted(maps.Keys(o.sb.files))
			o.path = l[r.rng.IntN(len(l))]
		} else {
			o.path = filePrefix + strconv.Itoa(o.n)
		}
		size := 16 + r.rng.IntN(256)
		if r.rng.IntN(4) == 0 {
			size = 4096 + r.rng.IntN(256<<10)
		}
		o.data = make([]byte, size)
		for i := range o.data {
			o.data[i] = byte(r.rng.Uint32())
		}
		h := sha256.Sum256(o.data)
		o.sum = hex.EncodeToString(h[:])
	case opVolWrite:
		o.sb = pick(stateRunning)
		r.planVolWrite(o)
	case opPause, opKill:
		o.sb = pick(stateRunning)
	case opResume:
		o.sb = pick(statePaused)
	case opTTL:
		o.sb = pick(stateRunning)
		if r.rng.IntN(4) == 0 && len(r.free(statePaused)) > 0 {
			o.sb.busy = false
			o.sb = pick(statePaused) // its TTL counts from its resume
		}
		o.ttl = 1 + r.rng.IntN(3)
	}
	return o
}

// marker returns a new marker token: the argument of a `sleep` that runs
// in the background of a sandbox for as long as the sandbox lives.
func (r *runner) marker() string {
	r.markerN++
	return strconv.Itoa(1_000_000_000 + r.markerN)
}

// startMarker starts the marker process tok in sb. The command returns
// once the marker runs `sleep`: the shell that forks it exits at once, and
// until the child has called exec it is a copy of that shell (`ps` shows
// `sh -c ...`), which a probe coming quickly after on a loaded machine
// would not count. It waits at most ~5 s (a child that died ends the
// wait at once: its /proc entry is gone), and the probe decides.
func startMarker(ctx context.Context, sb *pandastack.Sandbox, tok string) error {
	res, err := sb.Exec(ctx, pandastack.Command{Cmd: "sleep " + tok + " </dev/null >/dev/null 2>&1 & " + markerStarted})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("start marker: exit %d: %s", res.ExitCode, res.Stderr)
	}
	return err
}

// markerStarted waits for the background job $! to be `sleep`.
const markerStarted = `i=0; while [ $i -lt 500 ] && [ -e /proc/$!/comm ] && [ "$(cat /proc/$!/comm)" != sleep ]; do i=$((i+1)); usleep 10000 2>/dev/null || sleep 1; done`

// do runs o against the API.
func (r *runner) do(ctx context.Context, o *op) {
	if o.delay > 0 {
		t := time.NewTimer(o.delay) // a kill racing another operation
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	c := r.clients[o.key]
	var h *pandastack.Sandbox
	if o.sb != nil {
		c = r.clients[o.sb.key]
		h = c.Sandbox(o.sb.id)
	}
	made := func(sbs []*pandastack.Sandbox) {
		for i, sb := range sbs {
			ns := newSandbox{info: sb.Info, marker: o.markers[i]}
			ns.markerErr = startMarker(ctx, sb, ns.marker)
			o.sandboxes = append(o.sandboxes, ns)
		}
	}
	switch o.kind {
	case opCreate, opCreateSnapshot:
		opts := pandastack.CreateOptions{TTLSeconds: longTTL, Metadata: map[string]string{labelRun: r.runID, labelOp: strconv.Itoa(o.n)},
			Volumes: r.volMounts(o.key)}
		if o.snap != nil {
			opts.SnapshotID = o.snap.id
		}
		var sb *pandastack.Sandbox
		sb, o.err = c.Create(ctx, opts)
		if o.err == nil {
			made([]*pandastack.Sandbox{sb})
		}
	case opFork:
		var kids []*pandastack.Sandbox
		kids, o.err = h.Fork(ctx, o.count)
		made(kids)
	case opExec:
		cmd, want := "echo chaos-"+strconv.Itoa(o.n), "chaos-"+strconv.Itoa(o.n)+"\n"
		if r.cfg.Network && o.path == "" {
			// Online, whatever happened to it: a fetch from the test
			// world's web server, by name (the sandbox's DNS too).
			cmd, want = "timeout 30 wget -q -O - http://allowed.test/", "hello from "+nettest.WebAddr.String()
		}
		if o.path != "" {
			cmd, want = "sha256sum "+o.path, o.sum+"  "+o.path+"\n"
		}
		var res pandastack.ExecResult
		res, o.err = h.Exec(ctx, pandastack.Command{Cmd: cmd})
		if o.err == nil && (res.ExitCode != 0 || res.Stdout != want) {
			o.bad = fmt.Sprintf("exec %q in %s: exit %d, stdout %q, stderr %q; want exit 0, stdout %q", cmd, o.sb.id, res.ExitCode, res.Stdout, res.Stderr, want)
		}
	case opWrite:
		_, o.err = h.WriteFile(ctx, o.path, bytes.NewReader(o.data), 0o644)
	case opVolWrite:
		o.err = doVolWrite(ctx, h, o)
	case opSnapshot:
		var sn pandastack.Snapshot
		sn, o.err = h.Snapshot(ctx, "")
		o.snapID = sn.ID
	case opDeleteSnapshot:
		o.err = c.DeleteSnapshot(ctx, o.snap.id)
	case opPause:
		o.err = h.Pause(ctx)
	case opResume:
		o.err = h.Resume(ctx)
	case opKill:
		o.err = h.Kill(ctx)
	case opTTL:
		o.err = h.SetTTL(ctx, o.ttl)
	}
}

// apply records o's outcome in the model. faulted says whether a fault
// may have interfered this iteration: then any failure is expected. It
// returns a violation if o failed when nothing excused it, or saw wrong
// data.
func (r *runner) apply(o *op, faulted bool) string {
	m := r.m
	excused := faulted
	if o.sb != nil && (o.sb.shortTTL || o.sb.vmmKilled || o.sb.killRace && !o.racer) {
		excused = true // it may have expired, its VMM was killed, a kill raced it
	}
	var ferr *pandastack.ForkError
	failed := o.err != nil && !(errors.As(o.err, &ferr) && len(o.sandboxes) > 0)
	outcome := "ok"
	for _, ns := range o.sandboxes {
		if ns.markerErr != nil {
			outcome = "failed"
		}
	}
	if o.err != nil {
		outcome = "failed"
	}
	r.rep.op(o.kind, outcome)
	var violation string
	switch {
	case o.bad != "":
		violation = o.bad
	case outcome != "ok" && !excused:
		err := o.err
		for _, ns := range o.sandboxes {
			err = errors.Join(err, ns.markerErr)
		}
		violation = fmt.Sprintf("%s failed with no fault injected: %v", o, err)
		r.rep.op(o.kind, "unexpected")
	}

	switch o.kind {
	case opCreate, opCreateSnapshot:
		if failed {
			m.pendingCreates[strconv.Itoa(o.n)] = o.from
		}
	case opFork:
		if failed {
			m.pendingForks[o.sb.id] = append(m.pendingForks[o.sb.id], o.from)
		}
	case opSnapshot:
		if o.err == nil {
			c := o.from.clone()
			m.snaps[o.snapID] = &snapshot{id: o.snapID, source: o.sb.id, contents: c}
		} else {
			m.pendingSnaps[o.sb.id] = append(m.pendingSnaps[o.sb.id], o.from)
		}
	case opDeleteSnapshot:
		delete(m.snaps, o.snap.id)
		if o.err != nil && !errors.Is(o.err, pandastack.ErrNotFound) {
			m.maybeSnaps[o.snap.id] = o.snap
		}
	case opWrite:
		w, ok := o.sb.files[o.path]
		if !ok {
			w = fileWant{sums: map[string]bool{}, maybeAbsent: true}
		}
		if o.err == nil {
			w = fileWant{sums: map[string]bool{}}
		}
		w.sums[o.sum] = true
		o.sb.files[o.path] = w
	case opPause:
		if o.err == nil {
			o.sb.out = NewOutcomes(statePaused)
		} else {
			o.sb.out[statePaused] = true
		}
	case opResume:
		if o.err == nil {
			o.sb.out = NewOutcomes(stateRunning)
		} else {
			o.sb.out[stateRunning] = true
		}
		o.sb.checkContent = true
	case opKill:
		if o.err == nil {
			for x := range o.sb.out {
				if !strings.HasPrefix(x, stateStopped) {
					delete(o.sb.out, x)
				}
			}
		}
		o.sb.out["stopped:killed"] = true
	case opTTL:
		o.sb.shortTTL = true
	case opVolWrite:
		r.applyVolWrite(o)
	}
	// The sandboxes it made.
	for _, ns := range o.sandboxes {
		c := o.from.clone()
		c.key = o.key
		if o.sb != nil {
			c.key = o.sb.key
		}
		c.markers[ns.marker] = ns.markerErr == nil
		sb := &sbox{id: ns.info.ID, state: stateRunning, contents: c, out: NewOutcomes(stateRunning),
			checkContent: o.kind != opCreate, busy: true}
		sb.mayExpire()
		m.live[sb.id] = sb
	}
	return violation
}
