// Package chaos is PandaStack's fault-injection suite (`panda chaos`): it
// runs a real deployment (`panda up`, or `panda server` with `panda agent`)
// on a data directory of its own, loops random operations through the REST
// API (create, exec, write a file, fork, snapshot, pause, resume, kill,
// short TTLs, create from a snapshot), and at random moments kills the
// server, the agent or a sandbox's QEMU with SIGKILL, stops them with
// SIGTERM, or restarts a process with a failpoint that crashes it inside a
// pause, resume, snapshot or fork; it restarts what died. After every
// iteration it checks the invariants (Check) against what it knows it did
// (the model): the catalog, the QEMU processes and the files on disk
// agree; no sandbox whose data existed is gone; nothing is orphaned; every
// paused sandbox resumes with its files and processes. At the end it kills
// everything, stops the deployment with SIGTERM and checks that it leaves
// nothing behind.
//
// Every random choice comes from one seed (Config.Seed), so a failing run
// can be replayed with the same operations and faults; the timing of a
// fault relative to an operation is real and varies between replays.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// Config configures a run.
type Config struct {
	// Bin is the panda binary to run (required; `panda chaos` passes its
	// own executable).
	Bin string
	// Images is the guest images directory (required).
	Images string
	// DataDir is the deployment's data directory: "" is a new temporary
	// directory, removed at the end; a directory given must be empty or
	// not exist, and is kept.
	DataDir string
	// Split runs `panda agent` and `panda server` instead of `panda up`.
	Split bool
	// Iterations to run (default 100); ignored if Soak is set.
	Iterations int
	// Soak, if set, runs for this long instead of a number of iterations,
	// without killing the server or the agent, and samples their RSS,
	// open files and goroutines every SampleEvery (default a minute):
	// they must stay flat.
	Soak        time.Duration
	SampleEvery time.Duration
	// Seed seeds every random choice; 0 picks one (reported).
	Seed int64
	// KeepGoing goes on after a violation (the report lists them all)
	// instead of stopping at the first.
	KeepGoing bool
	// Accel, Template and MemoryMiB are the deployment's accelerator and
	// default template and memory (default tcg, tiny, 256).
	Accel     string
	Template  string
	MemoryMiB int
	// MaxLive bounds the sandboxes held live at once (default 8).
	MaxLive int
	// FaultRate is the probability that an iteration injects a fault
	// (default 0.35).
	FaultRate float64
	// MaxOps is the most operations of one iteration, run concurrently on
	// distinct sandboxes (default 3).
	MaxOps int
	// Network runs the deployment with sandbox networking on, inside a
	// test world of namespaces the run makes (nettest: its host namespace
	// and an "internet" of test servers; nothing reaches the machine's own
	// network): execs fetch from the test web server, and the checks
	// include the sandboxes' network namespaces.
	Network bool
	// Log receives a line per iteration; nil discards them.
	Log io.Writer
}

func (c *Config) setDefaults() {
	if c.Iterations == 0 {
		c.Iterations = 100
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = time.Minute
	}
	if c.Accel == "" {
		c.Accel = "tcg"
	}
	if c.Template == "" {
		c.Template = "tiny"
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = 256
	}
	if c.MaxLive == 0 {
		c.MaxLive = 8
	}
	if c.FaultRate == 0 {
		c.FaultRate = 0.35
	}
	if c.MaxOps == 0 {
		c.MaxOps = 3
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	switch {
	case c.Bin == "":
		return errors.New("chaos: no panda binary")
	case c.Images == "":
		return errors.New("chaos: no images directory")
	case c.Iterations < 0 || c.Soak < 0 || c.SampleEvery < 0:
		return errors.New("chaos: iterations, soak and sample interval must not be negative")
	case c.FaultRate < 0 || c.FaultRate > 1:
		return fmt.Errorf("chaos: fault rate %v must be between 0 and 1", c.FaultRate)
	case c.MaxLive < 2:
		return fmt.Errorf("chaos: at most %d live sandboxes: want at least 2", c.MaxLive)
	}
	if c.DataDir != "" {
		if ents, err := os.ReadDir(c.DataDir); err == nil && len(ents) > 0 {
			return fmt.Errorf("chaos: data directory %s is not empty", c.DataDir)
		}
	}
	return nil
}

// Timing bounds.
const (
	opTimeout      = 3 * time.Minute  // one operation
	settleTimeout  = 90 * time.Second // invariants to hold after an iteration
	readyTimeout   = 2 * time.Minute  // a restarted deployment to answer
	contentTimeout = time.Minute      // a sandbox's guest to answer a probe
)

// ErrViolation is the class of the error Run returns when an invariant
// did not hold (not when the deployment could not be run).
var ErrViolation = errors.New("invariant violated")

// runner is one run.
type runner struct {
	cfg     Config
	rng     *rand.Rand
	cl      *cluster
	clients []*pandastack.Client // [0] admin, [1] a tenant
	m       *model
	rep     *Report
	runID   string
	it      int
	opN     int
	markerN int
	soak    *soaker
	vols    []*volState // by key, as clients
}

// Run runs the suite as cfg says and returns its report. The error is nil
// if every invariant held and the deployment stopped cleanly; it wraps
// ErrViolation (with the seed, the iteration and what differed) if one did
// not.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Int64()
	}
	rep := newReport(cfg)
	t0 := time.Now()

	own := cfg.DataDir == ""
	dataDir := cfg.DataDir
	if own {
		// Short: unix socket paths under it are limited to 108 bytes.
		d, err := os.MkdirTemp("", "pc")
		if err != nil {
			return *rep, fmt.Errorf("chaos: data directory: %w", err)
		}
		dataDir = d
	} else if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return *rep, fmt.Errorf("chaos: data directory: %w", err)
	}
	rep.DataDir = dataDir
	var world *nettest.Env
	if cfg.Network {
		w, err := nettest.Build()
		if err != nil {
			return *rep, fmt.Errorf("chaos: network world: %w", err)
		}
		defer w.Close()
		world = w
	}
	cl, err := newCluster(cfg, dataDir, world)
	if err != nil {
		return *rep, err
	}
	r := &runner{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x70616e6461)), cl: cl, m: newModel(), rep: rep,
		runID: strconv.FormatInt(cfg.Seed, 36)}
	fmt.Fprintf(cfg.Log, "chaos: seed %d, %s mode, data directory %s\n", cfg.Seed, rep.Mode, dataDir)

	err = r.run(ctx)
	if err != nil && !errors.Is(err, ErrViolation) {
		err = fmt.Errorf("chaos (seed %d, iteration %d): %w", cfg.Seed, r.it, err)
	}
	if err != nil {
		rep.Logs = cl.logs()
	}
	// Whatever happened, nothing is left running or mounted.
	stopErr := cl.stopAll()
	if err == nil && stopErr != nil {
		err = r.violation(stopErr.Error())
	}
	if err == nil && cl.netPrefix != "" {
		if left := Namespaces(cl.netPrefix); len(left) > 0 {
			err = r.violation(fmt.Sprintf("network namespaces left after the deployment stopped: %v", left))
		}
	}
	if own {
		left, rerr := pandatest.RemoveDataDir(dataDir)
		if err == nil {
			var msgs []string
			for _, l := range left {
				msgs = append(msgs, "left behind: "+l)
			}
			if rerr != nil {
				msgs = append(msgs, rerr.Error())
			}
			if len(msgs) > 0 {
				err = r.violation(strings.Join(msgs, "; "))
			}
		}
	} else if err == nil {
		if pids := QEMUProcesses(dataDir); len(pids) > 0 {
			err = r.violation(fmt.Sprintf("QEMU processes left running: %v", slices.Sorted(maps.Keys(pids))))
		} else if mps := MountsUnder(dataDir); len(mps) > 0 {
			err = r.violation(fmt.Sprintf("left mounted: %v", mps))
		}
	}
	if err == nil && len(rep.Violations) > 0 {
		err = fmt.Errorf("%w: %d violations (seed %d); the first: %s", ErrViolation, len(rep.Violations), cfg.Seed, rep.Violations[0])
	}
	rep.setDuration(time.Since(t0))
	return *rep, err
}

// violation records what did not hold and returns it as an error naming
// the seed and the iteration.
func (r *runner) violation(what string) error {
	msg := fmt.Sprintf("seed %d, iteration %d: %s", r.cfg.Seed, r.it, what)
	r.rep.Violations = append(r.rep.Violations, msg)
	fmt.Fprintf(r.cfg.Log, "VIOLATION %s\n", msg)
	return fmt.Errorf("%w: %s", ErrViolation, msg)
}

// fail records violations; it returns an error (the first) unless the run
// keeps going.
func (r *runner) fail(vs []string) error {
	var first error
	for _, v := range vs {
		if err := r.violation(v); first == nil {
			first = err
		}
	}
	if r.cfg.KeepGoing {
		return nil
	}
	return first
}

func (r *runner) run(ctx context.Context) error {
	if err := r.cl.startAll(); err != nil {
		return err
	}
	admin, err := r.cl.client(r.cl.adminKey)
	if err != nil {
		return err
	}
	key, err := admin.CreateKey(ctx, "chaos-tenant", false, pandastack.Quotas{})
	if err != nil {
		return fmt.Errorf("create a tenant key: %w", err)
	}
	tenant, err := r.cl.client(key.Key)
	if err != nil {
		return err
	}
	r.clients = []*pandastack.Client{admin, tenant}
	if err := r.createVolumes(ctx); err != nil {
		return err
	}
	if r.cfg.Soak > 0 {
		r.soak = newSoaker(r)
		r.soak.sample(ctx)
	}
	start := time.Now()
	for {
		if r.cfg.Soak > 0 && time.Since(start) >= r.cfg.Soak || r.cfg.Soak == 0 && r.it >= r.cfg.Iterations {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.iteration(ctx); err != nil {
			return err
		}
		r.rep.Iterations = r.it
		if r.soak != nil && r.soak.due() {
			r.soak.sample(ctx)
		}
	}
	if r.soak != nil {
		r.soak.sample(ctx)
		r.rep.Soak = r.soak.report()
		if !r.rep.Soak.Flat {
			if err := r.fail([]string{"soak: " + r.rep.Soak.Verdict}); err != nil {
				return err
			}
		}
	}
	return r.finish(ctx)
}

// iteration runs one iteration: maybe a fault, one to MaxOps operations
// at once, restarts of what died, and the checks.
func (r *runner) iteration(ctx context.Context) error {
	r.it++
	r.m.begin()
	var line strings.Builder
	fmt.Fprintf(&line, "it %d:", r.it)
	// A process that runs with a failpoint may crash in any operation.
	faulted := r.cl.anyArmed()

	f := r.planFault()
	crashed, want, err := r.armFault(ctx, f)
	if err != nil {
		return err
	}
	faulted = faulted || f != nil
	ops := r.planOps(1+r.rng.IntN(r.cfg.MaxOps), want)
	if r.doAll(ctx, ops, f) {
		crashed = true
	}
	if f != nil {
		fmt.Fprintf(&line, " fault %s;", f)
		r.noteFault(f)
	}

	died, err := r.recoverProcesses(&line)
	if err != nil {
		return err
	}
	if died {
		crashed, faulted = true, true
	}
	if f != nil && f.err != nil {
		if err := r.fail([]string{f.err.Error()}); err != nil {
			return err
		}
	}
	if err := r.ready(ctx); err != nil {
		return err
	}
	return r.verify(ctx, ops, faulted, crashed, &line)
}

// armFault counts fault f (nil: none) in the report and, for a failpoint,
// crashes its process now and starts it again with the point enabled: it
// then reports a crash, and the kind of operation of this iteration that
// must aim at the point (want).
func (r *runner) armFault(ctx context.Context, f *fault) (crashed bool, want string, err error) {
	if f == nil {
		return false, "", nil
	}
	r.rep.Faults[f.kind]++
	if f.kind != faultFailpoint {
		return false, "", nil
	}
	r.cl.kill(f.role)
	if err := r.restart(f.role, f.point); err != nil {
		return false, "", err
	}
	if err := r.ready(ctx); err != nil {
		return false, "", err
	}
	return true, f.op, nil
}

// doAll runs ops at once, each within opTimeout, and injects fault f (if
// any, and not a failpoint, which armFault set) after its delay, or once
// the operations are over if they end first. It returns when all are
// done, reporting whether the fault crashed a process (any but a
// kill-qemu).
func (r *runner) doAll(ctx context.Context, ops []*op, f *fault) (crashed bool) {
	var wg sync.WaitGroup
	for _, o := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			defer cancel()
			r.do(octx, o)
		}()
	}
	if f != nil && f.kind != faultFailpoint {
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		t := time.NewTimer(f.delay)
		select {
		case <-t.C:
		case <-done: // the fault lands once the operations are over
		case <-ctx.Done():
		}
		t.Stop()
		r.inject(f)
		crashed = f.kind != faultKillQEMU
	}
	wg.Wait()
	return crashed
}

// noteFault tells the model what fault f did: a VMM killed, or the
// shutdown that stopped the sandboxes of the process terminated.
func (r *runner) noteFault(f *fault) {
	switch {
	case f.kind == faultKillQEMU && f.pid != 0:
		f.sb.vmmKilled = true
	case f.kind == faultTermServer && !r.cfg.Split:
		r.m.shutdown = "server_shutdown"
	case f.kind == faultTermAgent:
		r.m.shutdown = "host_shutdown"
	}
}

// recoverProcesses reaps the processes that crashed at their failpoint
// (counted in the report) or died otherwise (a violation), and starts
// every process that is not running again, noting both on line. It
// reports whether any had died.
func (r *runner) recoverProcesses(line *strings.Builder) (died bool, err error) {
	for _, role := range r.cl.roles() {
		if r.cl.procs[role] == nil || !r.cl.waitExitedOrHealthy(role, 10*time.Second) {
			continue
		}
		point := r.cl.armed[role]
		r.cl.reap(role)
		died = true
		if point == "" {
			if err := r.fail([]string{fmt.Sprintf("panda %s exited by itself", role)}); err != nil {
				return died, err
			}
			continue
		}
		r.rep.FailpointsHit[point]++
		fmt.Fprintf(line, " crashed at %s;", point)
	}
	for _, role := range r.cl.roles() {
		if r.cl.procs[role] == nil {
			if err := r.restart(role, ""); err != nil {
				return died, err
			}
			fmt.Fprintf(line, " restarted %s;", role)
		}
	}
	return died, nil
}

// verify applies the outcomes of ops to the model (faulted: a fault or a
// crash may have cut them short) and fails on what they violated; then,
// once the deployment settled, it probes the running sandboxes (all of
// them after a crash) and logs the iteration's line and a census.
func (r *runner) verify(ctx context.Context, ops []*op, faulted, crashed bool, line *strings.Builder) error {
	var vs []string
	for _, o := range ops {
		fmt.Fprintf(line, " [%s: %s]", o, outcomeText(o))
		if v := r.apply(o, faulted); v != "" {
			vs = append(vs, v)
		}
	}
	fmt.Fprintln(r.cfg.Log, line.String())
	if err := r.fail(vs); err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.settle(ctx); err != nil {
		return err
	}
	if crashed {
		// After a recovery every running sandbox must still hold its
		// files and processes.
		for _, sb := range r.m.live {
			sb.checkContent = true
		}
	}
	n, err := r.checkContents(ctx)
	if err != nil {
		return err
	}
	if err := r.checkVolumes(ctx); err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Log, "it %d: settled in %v, %d probed; %s\n", r.it, time.Since(t0).Round(time.Millisecond), n, r.census())
	return nil
}

// restart starts role's process again, with failpoint enabled ("" for
// none). The caller waits for the deployment to be ready once every
// process that died is back. A process that cannot start again on what
// its predecessor left is a violation.
func (r *runner) restart(role, failpoint string) error {
	if err := r.cl.start(role, failpoint); err != nil {
		return r.violation(err.Error())
	}
	r.rep.Restarts[role]++
	return nil
}

// ready waits until the restarted deployment answers: one that does not
// is a violation.
func (r *runner) ready(ctx context.Context) error {
	if err := r.cl.waitReady(ctx, r.clients[0], readyTimeout); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return r.violation(err.Error())
	}
	return nil
}

func outcomeText(o *op) string {
	var s []string
	if o.err != nil {
		s = append(s, "failed: "+oneLine(o.err.Error()))
	} else {
		s = append(s, "ok")
	}
	if o.snapID != "" {
		s = append(s, "→ "+o.snapID)
	}
	for _, ns := range o.sandboxes {
		t := "→ " + ns.info.ID
		if ns.markerErr != nil {
			t += " (marker: " + oneLine(ns.markerErr.Error()) + ")"
		}
		s = append(s, t)
	}
	return strings.Join(s, " ")
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// census says what the model holds.
func (r *runner) census() string {
	run, paused := 0, 0
	for _, sb := range r.m.live {
		if sb.state == stateRunning {
			run++
		} else {
			paused++
		}
	}
	return fmt.Sprintf("%d running, %d paused, %d snapshots", run, paused, len(r.m.snaps))
}

// settle waits until the invariants hold (at most settleTimeout: a
// sandbox whose TTL ran out, a VMM exit, a reconnecting server need a
// moment), then takes what it observed as the model's new state.
func (r *runner) settle(ctx context.Context) error {
	deadline := time.Now().Add(settleTimeout)
	for {
		obs, err := Observe(ctx, r.cl.dataDir, r.cl.netPrefix, r.clients)
		var vs []string
		if err != nil {
			vs = []string{"observe: " + err.Error()}
		} else {
			vs = Check(r.m.expectation(), obs)
		}
		if len(vs) == 0 {
			r.rep.Checks++
			r.m.commit(obs)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			if ferr := r.fail(vs); ferr != nil {
				return ferr
			}
			// Going on: take the catalog as it is.
			if err == nil {
				r.adoptAnyway(obs)
			}
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// adoptAnyway makes the model agree with an observation that failed the
// check, so that a run that keeps going checks what follows against what
// is, not against what should have been.
func (r *runner) adoptAnyway(obs Observation) {
	for id, sb := range r.m.live {
		rec, ok := obs.Sandboxes[id]
		if !ok || rec.State == stateStopped || transitional(rec.State) {
			delete(r.m.live, id)
			r.m.gone[id] = rec.StopReason
			continue
		}
		sb.state = rec.State
	}
	for id, rec := range obs.Sandboxes {
		if _, ok := r.m.live[id]; !ok {
			r.m.gone[id] = rec.StopReason
		}
	}
	for id := range r.m.snaps {
		if _, ok := obs.Snapshots[id]; !ok {
			delete(r.m.snaps, id)
		}
	}
	clear(r.m.pendingCreates)
	clear(r.m.pendingForks)
}

// checkContents probes each running sandbox marked for it (its files and
// marker processes) and returns how many it probed.
func (r *runner) checkContents(ctx context.Context) (int, error) {
	var todo []*sbox
	for _, sb := range r.running() {
		if sb.checkContent {
			todo = append(todo, sb)
		}
	}
	var mu sync.Mutex
	var vs []string
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, sb := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			v := r.probe(ctx, sb)
			mu.Lock()
			vs = append(vs, v...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	r.rep.ContentChecks += len(todo)
	slices.Sort(vs)
	return len(todo), r.fail(vs)
}

// probe runs the probe in sb, retrying while its guest agent is not
// answering yet (after an adoption), and checks what it found. A sandbox
// that stopped meanwhile is left to the next settle.
func (r *runner) probe(ctx context.Context, sb *sbox) []string {
	c := r.clients[sb.key]
	deadline := time.Now().Add(contentTimeout)
	for {
		pctx, cancel := context.WithTimeout(ctx, contentTimeout)
		res, err := c.Sandbox(sb.id).Exec(pctx, pandastack.Command{Cmd: probe})
		cancel()
		if err == nil && res.ExitCode == 0 {
			sb.checkContent = false
			return sb.checkProbe(sb.id, res.Stdout)
		}
		if err == nil {
			err = fmt.Errorf("exit %d, stderr %q", res.ExitCode, res.Stderr)
		}
		if info, gerr := c.Get(ctx, sb.id); gerr == nil && info.Info.State != pandastack.StateRunning {
			return nil // it expired or its VMM died: the next settle judges
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return []string{fmt.Sprintf("sandbox %s: cannot list its files and processes: %v (%s)", sb.id, err, r.diagnose(ctx, sb))}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// runOps runs ops at most parallel at a time and applies their outcomes
// (nothing excuses a failure).
func (r *runner) runOps(ctx context.Context, ops []*op, parallel int) error {
	var wg sync.WaitGroup
	sem := make(chan struct{}, parallel)
	for _, o := range ops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			defer cancel()
			r.do(octx, o)
		}()
	}
	wg.Wait()
	var vs []string
	for _, o := range ops {
		if v := r.apply(o, false); v != "" {
			vs = append(vs, v)
		}
	}
	return r.fail(vs)
}

// newOp makes an operation of kind outside the random plan.
func (r *runner) newOp(kind string) *op {
	r.opN++
	return &op{kind: kind, n: r.opN}
}

// disarm crashes every process that runs with a failpoint and starts it
// again without one, then waits until the deployment settles with every
// running sandbox's contents checked.
func (r *runner) disarm(ctx context.Context) error {
	disarmed := false
	for _, role := range r.cl.roles() {
		if r.cl.armed[role] == "" {
			continue
		}
		r.cl.kill(role)
		if err := r.restart(role, ""); err != nil {
			return err
		}
		fmt.Fprintf(r.cfg.Log, "final: restarted %s without its failpoint\n", role)
		disarmed = true
	}
	if !disarmed {
		return nil
	}
	if err := r.ready(ctx); err != nil {
		return err
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	for _, sb := range r.m.live {
		sb.checkContent = true
	}
	_, err := r.checkContents(ctx)
	return err
}

// finish ends a run: every paused sandbox must resume with its files and
// processes, and every snapshot must restore into a sandbox that holds
// what its source held; then every sandbox is killed and the invariants
// must hold with no sandbox left (no QEMU, no sandbox or run directory).
// Run then stops the deployment and checks what it leaves.
func (r *runner) finish(ctx context.Context) error {
	r.it++
	step := func(what string, ops []*op) error {
		if err := r.runOps(ctx, ops, 2); err != nil {
			return err
		}
		if err := r.settle(ctx); err != nil {
			return err
		}
		n, err := r.checkContents(ctx)
		fmt.Fprintf(r.cfg.Log, "final: %s: %d operations, %d probed; %s\n", what, len(ops), n, r.census())
		return err
	}
	killAll := func() []*op {
		var ops []*op
		for _, sb := range slices.Concat(r.free(stateRunning), r.free(statePaused)) {
			o := r.newOp(opKill)
			o.sb = sb
			ops = append(ops, o)
		}
		return ops
	}

	// A failpoint armed in an earlier iteration and not hit yet would
	// crash a final operation, which nothing excuses: restart that process
	// without it first (a crash, so every sandbox is probed again).
	if err := r.disarm(ctx); err != nil {
		return err
	}
	r.m.begin()
	var ops []*op
	for _, sb := range r.free(statePaused) {
		o := r.newOp(opResume)
		o.sb = sb
		ops = append(ops, o)
	}
	if err := step("resume every paused sandbox", ops); err != nil {
		return err
	}
	// A short run may never have drawn a fork: every run forks at least
	// once, so that each one exercises every kind of operation.
	if r.rep.Ops[opFork]["ok"] == 0 && len(r.free(stateRunning)) > 0 && len(r.m.live) < r.cfg.MaxLive {
		r.m.begin()
		room := 1
		if err := step("fork a sandbox (the run forked none)", []*op{r.plan(opFork, &room)}); err != nil {
			return err
		}
	}
	r.m.begin()
	if err := step("kill every sandbox", killAll()); err != nil {
		return err
	}
	snaps := r.freeSnaps()
	for len(snaps) > 0 {
		batch := snaps[:min(len(snaps), r.cfg.MaxLive)]
		snaps = snaps[len(batch):]
		r.m.begin()
		ops = nil
		for _, sn := range batch {
			o := r.newOp(opCreateSnapshot)
			o.snap, o.key, o.from = sn, sn.key, sn.contents.clone()
			o.from.shortTTL = false
			o.markers = []string{r.marker()}
			ops = append(ops, o)
		}
		if err := step("create a sandbox from every snapshot", ops); err != nil {
			return err
		}
		r.m.begin()
		if err := step("kill them", killAll()); err != nil {
			return err
		}
	}
	if len(r.m.live) > 0 {
		return r.fail([]string{fmt.Sprintf("sandboxes left after killing them all: %v", slices.Sorted(maps.Keys(r.m.live)))})
	}
	return nil
}

// diagnose says what can be seen of a sandbox that does not answer: its
// record, its QEMU process (state, CPU time used over a second), and
// whether another kind of guest request answers.
func (r *runner) diagnose(ctx context.Context, sb *sbox) string {
	c := r.clients[sb.key]
	var parts []string
	if info, err := c.Get(ctx, sb.id); err == nil {
		parts = append(parts, fmt.Sprintf("record %s", info.Info.State))
	}
	parts = append(parts, r.cl.vmmState(sb.id))
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := c.Sandbox(sb.id).Stat(sctx, "/")
	cancel()
	parts = append(parts, fmt.Sprintf("stat /: %v", err))
	return strings.Join(parts, "; ")
}
