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
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	res := ForkResult{Template: o.Template, Accel: string(a.Accel())}
	var live []*pandastack.Sandbox
	var mu sync.Mutex
	track := func(sbs ...*pandastack.Sandbox) {
		mu.Lock()
		live = append(live, sbs...)
		mu.Unlock()
	}
	defer func() {
		for _, sb := range live {
			sb.Kill(context.WithoutCancel(ctx))
		}
	}()
	create := func(mem int) (*pandastack.Sandbox, error) {
		sb, err := c.Create(ctx, pandastack.CreateOptions{Template: o.Template, MemoryMiB: mem, TTLSeconds: 3600})
		if err != nil {
			return nil, err
		}
		track(sb)
		return sb, nil
	}
	run := func(sb *pandastack.Sandbox, cmd string) error {
		r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd, Timeout: 5 * time.Minute})
		if err != nil {
			return fmt.Errorf("exec %q in %s: %w", cmd, sb.ID, err)
		}
		if r.ExitCode != 0 {
			return fmt.Errorf("exec %q in %s: exit %d: %s", cmd, sb.ID, r.ExitCode, r.Stderr)
		}
		return nil
	}
	dirty := func(sb *pandastack.Sandbox, mib int, name string) error {
		// tmpfs lives in guest RAM: this dirties about mib MiB of it.
		return run(sb, fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/%s bs=1M count=%d 2>/dev/null", name, mib))
	}

	// 1. Fork → first exec, per guest RAM size.
	for _, mem := range o.MemorySizes {
		logf("fork latency at %d MiB (bakes the template on first use)", mem)
		parent, err := create(mem)
		if err != nil {
			return res, err
		}
		if err := dirty(parent, o.DirtyMiB, "parent"); err != nil {
			return res, err
		}
		fs := ForkSize{MemoryMiB: mem}
		var lat, pause, vcpus, vmms []time.Duration
		for i := 0; i < o.Rounds+1; i++ {
			t0 := time.Now()
			kids, info, err := forkN(ctx, parent, 1)
			if err != nil {
				return res, err
			}
			track(kids...)
			if err := run(kids[0], "true"); err != nil {
				return res, err
			}
			d := time.Since(t0)
			cpu, cpuErr := firstExecCPU(a, kids[0].ID)
			kids[0].Kill(ctx)
			if i == 0 {
				continue // the first fork of a size warms the host page cache
			}
			lat = append(lat, d)
			if cpuErr != nil {
				logf("  %v", cpuErr)
			} else {
				vcpus, vmms = append(vcpus, cpu.VCPU), append(vmms, cpu.All)
			}
			pause = append(pause, time.Duration(info.pausedMS*float64(time.Millisecond)))
			fs.DirtyMiB = math.Round(float64(info.dirtyBytes)/(1<<20)*10) / 10
		}
		fs.ForkToExec, fs.ParentPause = Summarize(lat), Summarize(pause)
		fs.ChildVCPU, fs.ChildVMM = Summarize(vcpus), Summarize(vmms)
		res.BySize = append(res.BySize, fs)
		parent.Kill(ctx)
		logf("  fork→exec p50 %.1f ms, parent paused p50 %.1f ms, %.1f MiB dirty; the child's VMM until its first exec: vCPU p50 %.1f ms, all p50 %.1f ms of CPU",
			fs.ForkToExec.P50, fs.ParentPause.P50, fs.DirtyMiB, fs.ChildVCPU.P50, fs.ChildVMM.P50)
	}
	if len(res.BySize) > 0 {
		lo, hi := math.Inf(1), 0.0
		for _, s := range res.BySize {
			lo, hi = math.Min(lo, s.ForkToExec.P50), math.Max(hi, s.ForkToExec.P50)
		}
		res.SpreadPct = math.Round((hi-lo)/lo*1000) / 10
	}

	// 2. Fan-out: fork(count) until every child answered.
	logf("fan-out: fork(count=%d) x %d", o.Fanout, o.FanoutRuns)
	parent, err := create(o.MemoryMiB)
	if err != nil {
		return res, err
	}
	if err := dirty(parent, o.DirtyMiB, "parent"); err != nil {
		return res, err
	}
	var fan []time.Duration
	for i := 0; i < o.FanoutRuns; i++ {
		t0 := time.Now()
		kids, _, err := forkN(ctx, parent, o.Fanout)
		if err != nil {
			return res, err
		}
		track(kids...)
		var wg sync.WaitGroup
		errs := make([]error, len(kids))
		for j, k := range kids {
			wg.Add(1)
			go func() { defer wg.Done(); errs[j] = run(k, "true") }()
		}
		wg.Wait()
		fan = append(fan, time.Since(t0))
		for _, k := range kids {
			k.Kill(ctx)
		}
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
	}
	res.Fanout.Count, res.Fanout.AllReadyMS = o.Fanout, Summarize(fan)
	logf("  all %d ready: p50 %.1f ms", o.Fanout, res.Fanout.AllReadyMS.P50)

	// 3. Memory: children that each dirty ChildDirtyMiB, forked and naive.
	logf("memory: %d children dirtying %d MiB each, forked vs naive copies", o.MemChildren, o.ChildDirtyMiB)
	mem := ForkMemory{Children: o.MemChildren, ChildDirtyMiB: o.ChildDirtyMiB}
	idle, err := create(o.MemoryMiB)
	if err != nil {
		return res, err
	}
	if err := run(idle, "true"); err != nil {
		return res, err
	}
	settle(ctx)
	if m, err := a.Memory(idle.ID); err == nil {
		mem.IdleSandboxPSSMiB = mib(m.PSSBytes)
	}
	idle.Kill(ctx)
	mem.BudgetMiB = float64(o.MemChildren) * (float64(o.ChildDirtyMiB) + mem.IdleSandboxPSSMiB)

	measure := func(naive bool) (added float64, took time.Duration, err error) {
		before := hostPSS(a)
		t0 := time.Now()
		var ids []string
		if naive {
			ids = make([]string, o.MemChildren)
			for i := range ids {
				ids[i] = host.NewID()
			}
			r, err := a.ForkNaive(ctx, parent.ID, ids)
			if err != nil {
				return 0, 0, err
			}
			for _, ch := range r.Children {
				if ch.Err != nil {
					return 0, 0, ch.Err
				}
			}
		} else {
			kids, _, err := forkN(ctx, parent, o.MemChildren)
			if err != nil {
				return 0, 0, err
			}
			track(kids...)
			for _, k := range kids {
				ids = append(ids, k.ID)
			}
		}
		took = time.Since(t0)
		defer func() {
			for _, id := range ids {
				a.Kill(context.WithoutCancel(ctx), id)
			}
		}()
		var wg sync.WaitGroup
		errs := make([]error, len(ids))
		for i, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !naive {
					errs[i] = dirty(c.Sandbox(id), o.ChildDirtyMiB, "child")
					return
				}
				// Naive children are the agent's alone: the API does not know them.
				cmd := fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/child bs=1M count=%d 2>/dev/null", o.ChildDirtyMiB)
				r, err := a.Exec(ctx, id, guestproto.ExecRequest{Shell: cmd}, nil, nil, nil)
				if err == nil && r.ExitCode != 0 {
					err = fmt.Errorf("exec %q in %s: exit %d", cmd, id, r.ExitCode)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, 0, err
		}
		settle(ctx)
		return mib(hostPSS(a) - before), took, nil
	}
	f, ft, err := measure(false)
	if err != nil {
		return res, err
	}
	n, nt, err := measure(true)
	if err != nil {
		return res, err
	}
	mem.ForkAddedPSSMiB, mem.NaiveAddedPSSMiB = f, n
	mem.ForkMS, mem.NaiveMS = ms(ft), ms(nt)
	if f > 0 {
		mem.Ratio = math.Round(n/f*100) / 100
	}
	res.Memory = mem
	logf("  forked children added %.1f MiB (budget %.1f), naive copies %.1f MiB", f, mem.BudgetMiB, n)
	return res, nil
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
