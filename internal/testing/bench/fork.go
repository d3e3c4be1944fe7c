package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// ForkOptions configures ForkBench.
type ForkOptions struct {
	Template string
	// MemorySizes are the guest RAM sizes (MiB) whose fork latency is
	// compared: fork cost must not grow with RAM.
	MemorySizes []int
	Rounds      int // forks measured per memory size
	DirtyMiB    int // what the parent dirties before it is forked
	Fanout      int // children of the fan-out measurement
	FanoutRuns  int
	// MemChildren children each dirty ChildDirtyMiB for the memory figure.
	MemChildren   int
	ChildDirtyMiB int
	MemoryMiB     int // guest RAM of the fan-out and memory measurements
	Log           io.Writer
}

// ForkSize is the fork latency at one guest RAM size.
type ForkSize struct {
	MemoryMiB int `json:"memory_mib"`
	// ForkToExec is POST .../fork until the child answered its first exec.
	ForkToExec Dist `json:"fork_to_first_exec"`
	// ParentPause is how long the parent's vCPUs were stopped.
	ParentPause Dist    `json:"parent_pause"`
	DirtyMiB    float64 `json:"dirty_mib"`
	// CPU the child's VMM used from its start until its first exec
	// answered (see CreateResult.FirstExecVCPU).
	ChildVCPU Dist `json:"child_vcpu_cpu"`
	ChildVMM  Dist `json:"child_vmm_cpu"`
}

// ForkMemory compares what forked children cost the host with a naive
// copy of the parent's memory for each child, measured in the same run.
type ForkMemory struct {
	Children      int `json:"children"`
	ChildDirtyMiB int `json:"child_dirty_mib"`
	// IdleSandboxPSSMiB is the PSS of one idle sandbox fresh from the
	// template: the per-sandbox overhead.
	IdleSandboxPSSMiB float64 `json:"idle_sandbox_pss_mib"`
	// BudgetMiB = Children × (ChildDirtyMiB + IdleSandboxPSSMiB): the target.
	BudgetMiB float64 `json:"budget_mib"`
	// ForkAddedPSSMiB is the host PSS the forked children added.
	ForkAddedPSSMiB float64 `json:"fork_added_pss_mib"`
	// NaiveAddedPSSMiB is the same for children that each got a full
	// private copy of the parent's memory image.
	NaiveAddedPSSMiB float64 `json:"naive_added_pss_mib"`
	// NaiveForkMS is how long the naive fork of all children took, next to
	// ForkMS for the real one.
	ForkMS  float64 `json:"fork_ms"`
	NaiveMS float64 `json:"naive_fork_ms"`
	// Ratio is NaiveAddedPSSMiB / ForkAddedPSSMiB: the headline.
	Ratio float64 `json:"naive_over_fork_ratio"`
}

// ForkResult is the output of `panda bench fork`.
type ForkResult struct {
	Template string     `json:"template"`
	Accel    string     `json:"accel"`
	BySize   []ForkSize `json:"by_memory_size"`
	// SpreadPct is how far the slowest size's fork→exec p50 is above the
	// fastest's, in percent (target: within ±25 %).
	SpreadPct float64 `json:"p50_spread_pct"`
	Fanout    struct {
		Count      int  `json:"count"`
		AllReadyMS Dist `json:"all_ready"`
	} `json:"fanout"`
	Memory ForkMemory `json:"memory"`
}

// ForkBench measures fork through the HTTP API (c) of a server whose host
// agent is a (for the naive baseline and memory figures).
func ForkBench(ctx context.Context, c *pandastack.Client, a *hostagent.Agent, o ForkOptions) (ForkResult, error) {
	fr := &forkRun{c: c, a: a, o: o, logf: logTo(o.Log)}
	defer fr.killAll(ctx)
	res := ForkResult{Template: o.Template, Accel: string(a.Accel())}

	// 1. Fork → first exec, per guest RAM size.
	for _, mem := range o.MemorySizes {
		fs, err := fr.latency(ctx, mem)
		if err != nil {
			return res, err
		}
		res.BySize = append(res.BySize, fs)
	}
	res.SpreadPct = forkSpread(res.BySize)

	// 2. Fan-out: fork(count) until every child answered.
	fr.logf("fan-out: fork(count=%d) x %d", o.Fanout, o.FanoutRuns)
	parent, err := fr.create(ctx, o.MemoryMiB)
	if err != nil {
		return res, err
	}
	if err := fr.dirty(ctx, parent, o.DirtyMiB, "parent"); err != nil {
		return res, err
	}
	fan, err := fr.fanout(ctx, parent)
	if err != nil {
		return res, err
	}
	res.Fanout.Count, res.Fanout.AllReadyMS = o.Fanout, fan
	fr.logf("  all %d ready: p50 %.1f ms", o.Fanout, res.Fanout.AllReadyMS.P50)

	// 3. Memory: children that each dirty ChildDirtyMiB, forked and naive.
	mem, err := fr.memory(ctx, parent)
	if err != nil {
		return res, err
	}
	res.Memory = mem
	return res, nil
}

// forkRun is one ForkBench: what it measures with, and every sandbox it
// made through the API (killed when it ends).
type forkRun struct {
	c    *pandastack.Client
	a    *hostagent.Agent
	o    ForkOptions
	logf func(format string, args ...any)

	mu   sync.Mutex
	live []*pandastack.Sandbox
}

// track records sandboxes for killAll; safe for concurrent use.
func (fr *forkRun) track(sbs ...*pandastack.Sandbox) {
	fr.mu.Lock()
	fr.live = append(fr.live, sbs...)
	fr.mu.Unlock()
}

// killAll kills every sandbox tracked, even once ctx has ended.
func (fr *forkRun) killAll(ctx context.Context) {
	for _, sb := range fr.live {
		sb.Kill(context.WithoutCancel(ctx))
	}
}

// create creates a tracked sandbox of mem MiB from the template.
func (fr *forkRun) create(ctx context.Context, mem int) (*pandastack.Sandbox, error) {
	sb, err := fr.c.Create(ctx, pandastack.CreateOptions{Template: fr.o.Template, MemoryMiB: mem, TTLSeconds: 3600})
	if err != nil {
		return nil, err
	}
	fr.track(sb)
	return sb, nil
}

// run runs cmd in sb through the API; a command that exits non-zero is an
// error.
func (fr *forkRun) run(ctx context.Context, sb *pandastack.Sandbox, cmd string) error {
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd, Timeout: 5 * time.Minute})
	if err != nil {
		return fmt.Errorf("exec %q in %s: %w", cmd, sb.ID, err)
	}
	if r.ExitCode != 0 {
		return fmt.Errorf("exec %q in %s: exit %d: %s", cmd, sb.ID, r.ExitCode, r.Stderr)
	}
	return nil
}

// dirty has sb write mib MiB to /dev/shm/name: tmpfs lives in guest RAM,
// so this dirties about mib MiB of it.
func (fr *forkRun) dirty(ctx context.Context, sb *pandastack.Sandbox, mib int, name string) error {
	return fr.run(ctx, sb, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/%s bs=1M count=%d 2>/dev/null", name, mib))
}

// latency measures fork → the child's first exec, o.Rounds times, of a
// parent of mem MiB that dirtied o.DirtyMiB (after one unmeasured fork
// that warms the host's page cache), and the parent's pause and the
// child's CPU with it.
func (fr *forkRun) latency(ctx context.Context, mem int) (ForkSize, error) {
	fr.logf("fork latency at %d MiB (bakes the template on first use)", mem)
	fs := ForkSize{MemoryMiB: mem}
	parent, err := fr.create(ctx, mem)
	if err != nil {
		return fs, err
	}
	if err := fr.dirty(ctx, parent, fr.o.DirtyMiB, "parent"); err != nil {
		return fs, err
	}
	var lat, pause, vcpus, vmms []time.Duration
	for i := 0; i < fr.o.Rounds+1; i++ {
		t0 := time.Now()
		kids, info, err := forkN(ctx, parent, 1)
		if err != nil {
			return fs, err
		}
		fr.track(kids...)
		if err := fr.run(ctx, kids[0], "true"); err != nil {
			return fs, err
		}
		d := time.Since(t0)
		cpu, cpuErr := firstExecCPU(fr.a, kids[0].ID)
		kids[0].Kill(ctx)
		if i == 0 {
			continue // the first fork of a size warms the host page cache
		}
		lat = append(lat, d)
		if cpuErr != nil {
			fr.logf("  %v", cpuErr)
		} else {
			vcpus, vmms = append(vcpus, cpu.VCPU), append(vmms, cpu.All)
		}
		pause = append(pause, time.Duration(info.pausedMS*float64(time.Millisecond)))
		fs.DirtyMiB = math.Round(float64(info.dirtyBytes)/(1<<20)*10) / 10
	}
	fs.ForkToExec, fs.ParentPause = Summarize(lat), Summarize(pause)
	fs.ChildVCPU, fs.ChildVMM = Summarize(vcpus), Summarize(vmms)
	parent.Kill(ctx)
	fr.logf("  fork→exec p50 %.1f ms, parent paused p50 %.1f ms, %.1f MiB dirty; the child's VMM until its first exec: vCPU p50 %.1f ms, all p50 %.1f ms of CPU",
		fs.ForkToExec.P50, fs.ParentPause.P50, fs.DirtyMiB, fs.ChildVCPU.P50, fs.ChildVMM.P50)
	return fs, nil
}

// forkSpread is how far the slowest size's fork→exec p50 is above the
// fastest's, in percent (ForkResult.SpreadPct); 0 without sizes.
func forkSpread(sizes []ForkSize) float64 {
	if len(sizes) == 0 {
		return 0
	}
	lo, hi := math.Inf(1), 0.0
	for _, s := range sizes {
		lo, hi = math.Min(lo, s.ForkToExec.P50), math.Max(hi, s.ForkToExec.P50)
	}
	return math.Round((hi-lo)/lo*1000) / 10
}

// fanout forks parent into o.Fanout children, o.FanoutRuns times, and
// measures each time until every child answered an exec.
func (fr *forkRun) fanout(ctx context.Context, parent *pandastack.Sandbox) (Dist, error) {
	var fan []time.Duration
	for i := 0; i < fr.o.FanoutRuns; i++ {
		t0 := time.Now()
		kids, _, err := forkN(ctx, parent, fr.o.Fanout)
		if err != nil {
			return Dist{}, err
		}
		fr.track(kids...)
		var wg sync.WaitGroup
		errs := make([]error, len(kids))
		for j, k := range kids {
			wg.Add(1)
			go func() { defer wg.Done(); errs[j] = fr.run(ctx, k, "true") }()
		}
		wg.Wait()
		fan = append(fan, time.Since(t0))
		for _, k := range kids {
			k.Kill(ctx)
		}
		if err := errors.Join(errs...); err != nil {
			return Dist{}, err
		}
	}
	return Summarize(fan), nil
}

// memory compares the host memory that o.MemChildren children of parent
// add when each dirties o.ChildDirtyMiB, forked and as naive copies,
// against the budget of one idle sandbox's PSS plus what it dirtied per
// child.
func (fr *forkRun) memory(ctx context.Context, parent *pandastack.Sandbox) (ForkMemory, error) {
	o := fr.o
	fr.logf("memory: %d children dirtying %d MiB each, forked vs naive copies", o.MemChildren, o.ChildDirtyMiB)
	mem := ForkMemory{Children: o.MemChildren, ChildDirtyMiB: o.ChildDirtyMiB}
	idle, err := fr.create(ctx, o.MemoryMiB)
	if err != nil {
		return mem, err
	}
	if err := fr.run(ctx, idle, "true"); err != nil {
		return mem, err
	}
	settle(ctx)
	if m, err := fr.a.Memory(idle.ID); err == nil {
		mem.IdleSandboxPSSMiB = mib(m.PSSBytes)
	}
	idle.Kill(ctx)
	mem.BudgetMiB = float64(o.MemChildren) * (float64(o.ChildDirtyMiB) + mem.IdleSandboxPSSMiB)

	f, ft, err := fr.measure(ctx, parent, false)
	if err != nil {
		return mem, err
	}
	n, nt, err := fr.measure(ctx, parent, true)
	if err != nil {
		return mem, err
	}
	mem.ForkAddedPSSMiB, mem.NaiveAddedPSSMiB = f, n
	mem.ForkMS, mem.NaiveMS = ms(ft), ms(nt)
	if f > 0 {
		mem.Ratio = math.Round(n/f*100) / 100
	}
	fr.logf("  forked children added %.1f MiB (budget %.1f), naive copies %.1f MiB", f, mem.BudgetMiB, n)
	return mem, nil
}

// measure makes o.MemChildren children of parent (forked through the
// API, or naive copies through the agent), has each dirty
// o.ChildDirtyMiB, and returns the host PSS they added and how long
// making them took. The children are killed before it returns.
func (fr *forkRun) measure(ctx context.Context, parent *pandastack.Sandbox, naive bool) (added float64, took time.Duration, err error) {
	before := hostPSS(fr.a)
	t0 := time.Now()
	ids, err := fr.children(ctx, parent, naive)
	if err != nil {
		return 0, 0, err
	}
	took = time.Since(t0)
	defer func() {
		for _, id := range ids {
			fr.a.Kill(context.WithoutCancel(ctx), id)
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fr.dirtyChild(ctx, id, naive)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, 0, err
	}
	settle(ctx)
	return mib(hostPSS(fr.a) - before), took, nil
}

// children makes o.MemChildren children of parent and returns their ids:
// forked through the API (tracked), or, naive, each a full private copy
// of the parent's memory made by the agent alone.
func (fr *forkRun) children(ctx context.Context, parent *pandastack.Sandbox, naive bool) ([]string, error) {
	if !naive {
		kids, _, err := forkN(ctx, parent, fr.o.MemChildren)
		if err != nil {
			return nil, err
		}
		fr.track(kids...)
		var ids []string
		for _, k := range kids {
			ids = append(ids, k.ID)
		}
		return ids, nil
	}
	ids := make([]string, fr.o.MemChildren)
	for i := range ids {
		ids[i] = host.NewID()
	}
	r, err := fr.a.ForkNaive(ctx, parent.ID, ids)
	if err != nil {
		return nil, err
	}
	for _, ch := range r.Children {
		if ch.Err != nil {
			return nil, ch.Err
		}
	}
	return ids, nil
}

// dirtyChild has child id dirty o.ChildDirtyMiB of its memory: through the
// API, or for a naive child, which the API does not know, through the
// agent.
func (fr *forkRun) dirtyChild(ctx context.Context, id string, naive bool) error {
	if !naive {
		return fr.dirty(ctx, fr.c.Sandbox(id), fr.o.ChildDirtyMiB, "child")
	}
	cmd := fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/child bs=1M count=%d 2>/dev/null", fr.o.ChildDirtyMiB)
	r, err := fr.a.Exec(ctx, id, guestproto.ExecRequest{Shell: cmd}, nil, nil, nil)
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exec %q in %s: exit %d", cmd, id, r.ExitCode)
	}
	return err
}

type forkInfo struct {
	pausedMS   float64
	dirtyBytes int64
}

// forkN forks sb into n children through the API and fails if any child
// failed.
func forkN(ctx context.Context, sb *pandastack.Sandbox, n int) ([]*pandastack.Sandbox, forkInfo, error) {
	r, err := sb.ForkWithStats(ctx, n)
	if err != nil {
		for _, k := range r.Children {
			k.Kill(context.WithoutCancel(ctx))
		}
		return nil, forkInfo{}, fmt.Errorf("fork %s: %w", sb.ID, err)
	}
	return r.Children, forkInfo{pausedMS: r.ParentPausedMS, dirtyBytes: r.DirtyBytes}, nil
}

// hostPSS sums the PSS of every running sandbox's VMM.
func hostPSS(a *hostagent.Agent) int64 {
	var total int64
	for _, info := range a.List() {
		if m, err := a.Memory(info.ID); err == nil {
			total += m.PSSBytes
		}
	}
	return total
}

// settle lets guests finish what they were doing (page cache writeback,
// timers) before memory is read.
func settle(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
}

func mib(b int64) float64 { return math.Round(float64(b)/(1<<20)*10) / 10 }

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())/100) / 10 }
