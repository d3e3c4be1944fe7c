package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent"
)

// DensityOptions configures DensityBench.
type DensityOptions struct {
	Template  string
	MemoryMiB int
	VCPUs     int
	// N is how many idle sandboxes to start.
	N int
	// Parallel is how many creates run at once.
	Parallel int
	// ReserveMiB stops the creates early when the host's MemAvailable
	// falls below it: the benchmark must not push the host into swap or
	// the OOM killer. The result says how many were started and why.
	ReserveMiB int
	// Settle is how long the sandboxes idle before anything is measured
	// (their guests finish what the first exec started).
	Settle time.Duration
	// Window is how long host CPU use is measured, once with no sandbox
	// (the baseline) and once with all of them idle.
	Window time.Duration
	// Sample is how many of the sandboxes (spread evenly) get exec round
	// trips measured; Rounds how many each.
	Sample, Rounds int
	Log            io.Writer
}

// DensityResult is the output of `panda bench density`.
type DensityResult struct {
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	Accel     string `json:"accel"`
	CPUs      int    `json:"host_cpus"`
	// Sandboxes is how many idle sandboxes were measured; Asked how many
	// were asked for, StoppedEarly why fewer (empty if none).
	Sandboxes    int    `json:"sandboxes"`
	Asked        int    `json:"asked"`
	StoppedEarly string `json:"stopped_early,omitempty"`
	// CreateSeconds is how long starting them all took.
	CreateSeconds float64 `json:"create_seconds"`
	// PSS and private memory of each sandbox's VMM process (all its
	// mappings), averaged.
	PSSMiBPerSandbox     float64 `json:"pss_mib_per_sandbox"`
	PrivateMiBPerSandbox float64 `json:"private_mib_per_sandbox"`
	// MemAvailableDropMiBPerSandbox is /proc/meminfo's MemAvailable before
	// the first create minus after the settle, per sandbox.
	MemAvailableDropMiBPerSandbox float64 `json:"mem_available_drop_mib_per_sandbox"`
	// Host CPU busy (all but idle and iowait in /proc/stat) over Window,
	// in % of one core: before any sandbox, and with all of them idle.
	HostCPUPctBaseline float64 `json:"host_cpu_pct_of_core_baseline"`
	HostCPUPctIdle     float64 `json:"host_cpu_pct_of_core_all_idle"`
	// CPUPctOfCorePerSandbox is (all idle − baseline) / sandboxes: what
	// an idle sandbox costs the whole host. Other work on the host during
	// either window skews it; VMMCPUPctOfCorePerSandbox does not.
	CPUPctOfCorePerSandbox float64 `json:"cpu_pct_of_core_per_sandbox"`
	// VMMCPUPctOfCorePerSandbox is the CPU time the VMM processes
	// themselves used over the idle window (/proc/PID/stat utime+stime),
	// per sandbox; AgentCPUPctOfCore the host agent's (this process) over
	// the same window, for all of them.
	VMMCPUPctOfCorePerSandbox float64 `json:"vmm_cpu_pct_of_core_per_sandbox"`
	AgentCPUPctOfCore         float64 `json:"agent_cpu_pct_of_core"`
	// Exec is the round trip of argv ["true"] in the sampled sandboxes,
	// Rounds times each, round-robin.
	Exec      Dist    `json:"exec"`
	ExecP50MS float64 `json:"exec_p50_ms"`
	ExecP99MS float64 `json:"exec_p99_ms"`
}

// DensityBench starts N idle sandboxes on the host agent a, lets them
// settle, and measures what each costs the host while idle (memory, CPU)
// and how quickly one of many answers. It kills every sandbox it started
// before it returns, also on errors and when ctx ends.
func DensityBench(ctx context.Context, a *hostagent.Agent, o DensityOptions) (res DensityResult, err error) {
	d := &densityRun{a: a, o: o, logf: logTo(o.Log), req: host.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs}}
	res = DensityResult{Template: o.Template, MemoryMiB: o.MemoryMiB, Accel: string(a.Accel()), CPUs: runtime.NumCPU(), Asked: o.N}
	defer func() {
		if kerr := d.killAll(); kerr != nil && err == nil {
			err = kerr
		}
	}()

	d.logf("warming up (bakes the template if needed)")
	req := d.req
	req.Progress = func(m string) { d.logf("  %s", m) }
	info, err := a.Create(ctx, req)
	if err != nil {
		return res, err
	}
	if err := a.Kill(ctx, info.ID); err != nil {
		return res, err
	}

	d.logf("host CPU baseline over %s", o.Window)
	if res.HostCPUPctBaseline, err = hostCPU(ctx, o.Window); err != nil {
		return res, err
	}
	availBefore, err := memAvailable()
	if err != nil {
		return res, err
	}

	d.logf("starting %d idle sandboxes, %d at a time", o.N, o.Parallel)
	t0 := time.Now()
	stop, err := d.start(ctx, t0)
	if err != nil {
		return res, err
	}
	res.CreateSeconds = round(time.Since(t0).Seconds())
	res.Sandboxes, res.StoppedEarly = len(d.ids), stop
	if stop != "" {
		d.logf("stopped at %d sandboxes: %s", len(d.ids), stop)
	}
	if len(d.ids) == 0 {
		return res, errors.New("no sandbox started")
	}

	d.logf("settling for %s", o.Settle)
	if err := sleepCtx(ctx, o.Settle); err != nil {
		return res, err
	}
	if err := d.measureIdle(ctx, &res, availBefore); err != nil {
		return res, err
	}
	execs, err := d.execs(ctx)
	if err != nil {
		return res, err
	}
	res.Exec = Summarize(execs)
	res.ExecP50MS, res.ExecP99MS = res.Exec.P50, res.Exec.P99
	return res, nil
}

// densityRun is one DensityBench: the sandboxes it started (ids, in
// order) are killed when it ends.
type densityRun struct {
	a    *hostagent.Agent
	o    DensityOptions
	req  host.CreateRequest // of every idle sandbox
	logf func(format string, args ...any)

	mu  sync.Mutex
	ids []string
}

// killAll kills every sandbox started, and returns the first error but
// for one already gone.
func (d *densityRun) killAll() error {
	d.logf("killing %d sandboxes", len(d.ids))
	var err error
	for _, id := range d.ids {
		if kerr := d.a.Kill(context.Background(), id); kerr != nil && !errors.Is(kerr, host.ErrNotFound) && err == nil {
			err = fmt.Errorf("kill %s: %w", id, kerr)
		}
	}
	return err
}

// start creates up to o.N sandboxes, o.Parallel at a time, each until its
// first exec answered. It stops early, saying why in stop, when the
// host's MemAvailable falls below o.ReserveMiB; on the first failed create
// or first exec, with that error; and when ctx ends, with ctx's error.
// Its progress log counts from t0.
func (d *densityRun) start(ctx context.Context, t0 time.Time) (stop string, err error) {
	var (
		next     int
		firstErr error
		wg       sync.WaitGroup
	)
	for range max(d.o.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d.mu.Lock()
				if next >= d.o.N || stop != "" || firstErr != nil || ctx.Err() != nil {
					d.mu.Unlock()
					return
				}
				next++
				d.mu.Unlock()
				if avail, err := memAvailable(); err == nil && avail < int64(d.o.ReserveMiB)<<20 {
					d.mu.Lock()
					stop = fmt.Sprintf("MemAvailable %d MiB fell below the reserve of %d MiB", avail>>20, d.o.ReserveMiB)
					d.mu.Unlock()
					return
				}
				if err := d.startOne(ctx, t0); err != nil {
					d.mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("create/first exec %d: %w", len(d.ids), err)
					}
					d.mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return stop, firstErr
	}
	return stop, ctx.Err()
}

// startOne creates one sandbox, records it, and runs its first exec
// (the guest agent has answered once); it logs every 25th since t0.
func (d *densityRun) startOne(ctx context.Context, t0 time.Time) error {
	info, err := d.a.Create(ctx, d.req)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.ids = append(d.ids, info.ID)
	n := len(d.ids)
	d.mu.Unlock()
	var r guestproto.ExecResult
	if r, err = d.a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exit %d", r.ExitCode)
	}
	if n%25 == 0 {
		d.logf("started %d/%d (%.0f s)", n, d.o.N, time.Since(t0).Seconds())
	}
	return err
}

// measureIdle sets res's figures of the idle sandboxes: host CPU over
// o.Window against the baseline, the VMMs' and the agent's own CPU over
// the same window, the drop of MemAvailable since availBefore, and the
// VMMs' PSS and private memory, each per sandbox.
func (d *densityRun) measureIdle(ctx context.Context, res *DensityResult, availBefore int64) error {
	a, ids := d.a, d.ids
	availAfter, err := memAvailable()
	if err != nil {
		return err
	}
	d.logf("host CPU with %d idle sandboxes over %s", len(ids), d.o.Window)
	var pids []int
	for _, id := range ids {
		info, err := a.Get(id)
		if err != nil {
			return fmt.Errorf("get %s: %w", id, err)
		}
		pids = append(pids, info.PID)
	}
	vmm0, self0 := procTicks(pids...), procTicks(os.Getpid())
	w0 := time.Now()
	if res.HostCPUPctIdle, err = hostCPU(ctx, d.o.Window); err != nil {
		return err
	}
	vmm1, self1, w := procTicks(pids...), procTicks(os.Getpid()), time.Since(w0).Seconds()
	n := float64(len(ids))
	res.VMMCPUPctOfCorePerSandbox = math.Round(float64(vmm1-vmm0)/clockTicks/w/n*100*1000) / 1000
	res.AgentCPUPctOfCore = round(float64(self1-self0) / clockTicks / w * 100)
	res.CPUPctOfCorePerSandbox = math.Round((res.HostCPUPctIdle-res.HostCPUPctBaseline)/n*1000) / 1000
	res.MemAvailableDropMiBPerSandbox = round(float64(availBefore-availAfter) / n / (1 << 20))
	var pss, priv int64
	for _, id := range ids {
		m, err := a.Memory(id)
		if err != nil {
			return fmt.Errorf("memory of %s: %w", id, err)
		}
		pss += m.PSSBytes
		priv += m.PrivateBytes
	}
	res.PSSMiBPerSandbox = round(float64(pss) / n / (1 << 20))
	res.PrivateMiBPerSandbox = round(float64(priv) / n / (1 << 20))
	return nil
}

// execs measures exec round trips of true in o.Sample of the sandboxes,
// spread evenly, o.Rounds times each, round-robin.
func (d *densityRun) execs(ctx context.Context) ([]time.Duration, error) {
	ids := d.ids
	sample := min(max(d.o.Sample, 1), len(ids))
	d.logf("exec round trips in %d of them, %d rounds", sample, d.o.Rounds)
	var execs []time.Duration
	for range max(d.o.Rounds, 1) {
		for i := range sample {
			id := ids[i*len(ids)/sample]
			t := time.Now()
			r, err := d.a.Exec(ctx, id, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
			if err != nil || r.ExitCode != 0 {
				return nil, fmt.Errorf("exec in %s: %v (exit %d)", id, err, r.ExitCode)
			}
			execs = append(execs, time.Since(t))
		}
	}
	return execs, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// hostCPU is the host's CPU busy time over window, in % of one core.
func hostCPU(ctx context.Context, window time.Duration) (float64, error) {
	b0, t0, err := cpuTimes()
	if err != nil {
		return 0, err
	}
	if err := sleepCtx(ctx, window); err != nil {
		return 0, err
	}
	b1, t1, err := cpuTimes()
	if err != nil {
		return 0, err
	}
	if t1 <= t0 {
		return 0, errors.New("/proc/stat did not advance")
	}
	return round(float64(b1-b0) / float64(t1-t0) * float64(runtime.NumCPU()) * 100), nil
}

// cpuTimes reads the busy and total jiffies of all CPUs from /proc/stat.
func cpuTimes() (busy, total uint64, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, errors.New("/proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", sc.Text())
	}
	for i, s := range fields[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", s, err)
		}
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux ABI PandaStack runs on.
const clockTicks = 100

// procTicks is the user+system CPU time of the processes pids, in clock
// ticks (a process that is gone counts nothing).
func procTicks(pids ...int) (ticks uint64) {
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// The fields after the command name, which is in parentheses and
		// may hold spaces: state is field 3, utime 14, stime 15.
		_, rest, ok := strings.Cut(string(b), ") ")
		f := strings.Fields(rest)
		if !ok || len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		ticks += u + st
	}
	return ticks
}

// memAvailable is /proc/meminfo's MemAvailable in bytes.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemAvailable")
}
