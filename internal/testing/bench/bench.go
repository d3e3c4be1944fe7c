// Package bench measures PandaStack: latency distributions (median and
// p99, never a single run) and memory per sandbox. It is used by
// `panda bench`; numbers it prints go into docs/benchmarks.md.
package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent"
)

// Dist summarizes samples in milliseconds.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	// P99 is the nearest-rank 99th percentile: with fewer than 100
	// samples it is the maximum (output labels it so: TailName).
	P99 float64 `json:"p99_ms"`
	Min float64 `json:"min_ms"`
	Max float64 `json:"max_ms"`
}

// TailName is how output names the P99 of n samples: "p99" for 100 or
// more; "max" below that, where the nearest-rank 99th percentile is the
// largest sample and calling it p99 would promise a tail it did not see.
func TailName(n int) string {
	if n >= 100 {
		return "p99"
	}
	return "max"
}

// TailName is TailName(d.N).
func (d Dist) TailName() string { return TailName(d.N) }

// Summarize computes nearest-rank percentiles of d.
func Summarize(d []time.Duration) Dist {
	if len(d) == 0 {
		return Dist{}
	}
	ms := make([]float64, len(d))
	for i, v := range d {
		ms[i] = float64(v.Microseconds()) / 1000
	}
	sort.Float64s(ms)
	return Dist{
		N: len(ms), P50: Percentile(ms, 50), P90: Percentile(ms, 90), P99: Percentile(ms, 99),
		Min: round(ms[0]), Max: round(ms[len(ms)-1]),
	}
}

// Percentile is the nearest-rank percentile p (0-100] of sorted values.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return round(sorted[rank-1])
}

func round(v float64) float64 { return math.Round(v*10) / 10 }

// logTo returns a benchmark's progress log: one line to w per call, or
// nothing if w is nil.
func logTo(w io.Writer) func(format string, args ...any) {
	return func(format string, args ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", args...)
		}
	}
}

// CreateOptions configures CreateBench.
type CreateOptions struct {
	Template  string
	MemoryMiB int
	VCPUs     int
	N         int // sequential creates measured
	Execs     int // execs of `true` measured in one sandbox
	Idle      int // idle sandboxes whose memory is measured
	Log       io.Writer
}

// CreateResult is the output of `panda bench create`.
type CreateResult struct {
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	Accel     string `json:"accel"`
	// Create → first successful exec, sequential.
	Create Dist    `json:"create_to_first_exec"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	// Restore alone (until the guest agent answered).
	Restore Dist `json:"restore"`
	// CPU the sandbox's VMM used from its start until its first exec
	// answered: its vCPU thread (the guest's work; under TCG mostly the
	// translation of guest code run for the first time in this process)
	// and the whole process.
	FirstExecVCPU Dist `json:"first_exec_vcpu_cpu"`
	FirstExecVMM  Dist `json:"first_exec_vmm_cpu"`
	// Round trip of `true` in a warm sandbox.
	Exec      Dist    `json:"exec"`
	ExecP50MS float64 `json:"exec_p50_ms"`
	// Proportional set size per idle sandbox (QEMU process, all mappings).
	IdleSandboxes     int     `json:"idle_sandboxes"`
	PSSMiBPerSandbox  float64 `json:"pss_mib_per_sandbox"`
	PrivateMiBPerSbx  float64 `json:"private_mib_per_sandbox"`
	HostPSSMiBAllIdle float64 `json:"host_pss_mib_all_idle"`
}

// CreateBench measures create → first exec, exec round trips and idle
// memory through the host agent directly (no HTTP).
func CreateBench(ctx context.Context, a *hostagent.Agent, o CreateOptions) (CreateResult, error) {
	logf := logTo(o.Log)
	res := CreateResult{Template: o.Template, MemoryMiB: o.MemoryMiB, Accel: string(a.Accel())}
	req := hostagent.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs,
		Progress: func(m string) { logf("  %s", m) }}
	// Bake (if needed) and warm the host page cache with one untimed create.
	logf("warming up (bakes the template if needed)")
	info, err := a.Create(ctx, req)
	if err != nil {
		return res, err
	}
	if err := a.Kill(ctx, info.ID); err != nil {
		return res, err
	}
	req.Progress = nil

	var creates, restores, vcpus, vmms []time.Duration
	for i := 0; i < o.N; i++ {
		t0 := time.Now()
		info, err := a.Create(ctx, req)
		if err != nil {
			return res, fmt.Errorf("create %d: %w", i, err)
		}
		t1 := time.Now()
		r, err := a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		if err != nil || r.ExitCode != 0 {
			a.Kill(ctx, info.ID)
			return res, fmt.Errorf("first exec in %s: %v (exit %d)", info.ID, err, r.ExitCode)
		}
		creates = append(creates, time.Since(t0))
		restores = append(restores, t1.Sub(t0))
		if c, err := firstExecCPU(a, info.ID); err != nil {
			logf("  %v", err)
		} else {
			vcpus, vmms = append(vcpus, c.VCPU), append(vmms, c.All)
		}
		if err := a.Kill(ctx, info.ID); err != nil {
			return res, err
		}
		if (i+1)%10 == 0 {
			logf("create %d/%d", i+1, o.N)
		}
	}
	res.Create = Summarize(creates)
	res.Restore = Summarize(restores)
	res.FirstExecVCPU, res.FirstExecVMM = Summarize(vcpus), Summarize(vmms)
	res.P50MS, res.P99MS = res.Create.P50, res.Create.P99

	info, err = a.Create(ctx, req)
	if err != nil {
		return res, err
	}
	var execs []time.Duration
	for i := 0; i < o.Execs+5; i++ {
		t0 := time.Now()
		if _, err := a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil {
			a.Kill(ctx, info.ID)
			return res, err
		}
		if i >= 5 { // the first execs translate code paths for the first time
			execs = append(execs, time.Since(t0))
		}
	}
	a.Kill(ctx, info.ID)
	res.Exec = Summarize(execs)
	res.ExecP50MS = res.Exec.P50

	if o.Idle > 0 {
		logf("starting %d idle sandboxes", o.Idle)
		var ids []string
		defer func() {
			for _, id := range ids {
				a.Kill(context.Background(), id)
			}
		}()
		for i := 0; i < o.Idle; i++ {
			info, err := a.Create(ctx, req)
			if err != nil {
				return res, err
			}
			ids = append(ids, info.ID)
			if _, err := a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil {
				return res, err
			}
		}
		// Let the guests settle into idle before reading smaps.
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(2 * time.Second):
		}
		var pss, priv int64
		for _, id := range ids {
			m, err := a.Memory(id)
			if err != nil {
				return res, err
			}
			pss += m.PSSBytes
			priv += m.PrivateBytes
		}
		res.IdleSandboxes = len(ids)
		res.HostPSSMiBAllIdle = round(float64(pss) / (1 << 20))
		res.PSSMiBPerSandbox = round(float64(pss) / float64(len(ids)) / (1 << 20))
		res.PrivateMiBPerSbx = round(float64(priv) / float64(len(ids)) / (1 << 20))
	}
	return res, nil
}

// firstExecCPU is the CPU sandbox id's VMM has used so far.
func firstExecCPU(a *hostagent.Agent, id string) (VMMCPU, error) {
	info, err := a.Get(id)
	if err != nil {
		return VMMCPU{}, err
	}
	return vmmCPU(info.PID)
}
