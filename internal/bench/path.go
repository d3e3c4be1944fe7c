package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/guestproto"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// PathOptions configures PathBench.
type PathOptions struct {
	Template  string
	MemoryMiB int
	VCPUs     int
	N         int // rounds of create → first exec on each path
	Execs     int // exec round trips on each path
	Log       io.Writer
}

// PathResult compares the host path (the host agent called directly) with
// the API path (the REST API through the Go SDK, over the same agent), in
// one run with the two interleaved, so that the machine's noise falls on
// both alike.
type PathResult struct {
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	Accel     string `json:"accel"`
	// Create → first exec of true answered.
	HostCreate Dist `json:"host_create_first_exec"`
	APICreate  Dist `json:"api_create_first_exec"`
	// APIOverCreate is APICreate's p50 over HostCreate's (1.10 = 10 %
	// more).
	APIOverCreate float64 `json:"api_over_host_create_p50"`
	// Exec round trip of true in a running sandbox.
	HostExec    Dist    `json:"host_exec"`
	APIExec     Dist    `json:"api_exec"`
	APIOverExec float64 `json:"api_over_host_exec_p50"`
}

// PathBench measures create → first exec and exec round trips through the
// host agent a and through the API client c over the same agent,
// alternating the two (which goes first alternates too).
func PathBench(ctx context.Context, a *agent.Agent, c *pandastack.Client, o PathOptions) (PathResult, error) {
	res := PathResult{Template: o.Template, MemoryMiB: o.MemoryMiB, Accel: string(a.Accel())}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	req := agent.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs}
	opts := pandastack.CreateOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs, TTLSeconds: 600}
	viaHost := func() (time.Duration, string, error) {
		t0 := time.Now()
		info, err := a.Create(ctx, req)
		if err != nil {
			return 0, "", err
		}
		r, err := a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		return time.Since(t0), info.ID, err
	}
	viaAPI := func() (time.Duration, *pandastack.Sandbox, error) {
		t0 := time.Now()
		sb, err := c.Create(ctx, opts)
		if err != nil {
			return 0, nil, err
		}
		r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		return time.Since(t0), sb, err
	}
	// Warm both paths (a bake if needed, the page cache, connections).
	logf("warming up (bakes the template if needed)")
	if _, id, err := viaHost(); id != "" {
		a.Kill(ctx, id)
		if err != nil {
			return res, err
		}
	} else if err != nil {
		return res, err
	}
	if _, sb, err := viaAPI(); sb != nil {
		sb.Kill(ctx)
		if err != nil {
			return res, err
		}
	} else if err != nil {
		return res, err
	}
	var host, api []time.Duration
	for i := range o.N {
		for j := range 2 {
			if (i+j)%2 == 0 {
				d, id, err := viaHost()
				if id != "" {
					a.Kill(ctx, id)
				}
				if err != nil {
					return res, fmt.Errorf("host path: %w", err)
				}
				host = append(host, d)
			} else {
				d, sb, err := viaAPI()
				if sb != nil {
					sb.Kill(ctx)
				}
				if err != nil {
					return res, fmt.Errorf("api path: %w", err)
				}
				api = append(api, d)
			}
		}
		if (i+1)%10 == 0 {
			logf("create %d/%d", i+1, o.N)
		}
	}
	res.HostCreate, res.APICreate = Summarize(host), Summarize(api)
	if res.HostCreate.P50 > 0 {
		res.APIOverCreate = round2(res.APICreate.P50 / res.HostCreate.P50)
	}
	// Exec round trips in one sandbox, both paths alternating.
	sb, err := c.Create(ctx, opts)
	if err != nil {
		return res, err
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	var hostExec, apiExec []time.Duration
	for i := range o.Execs {
		for j := range 2 {
			t0 := time.Now()
			var err error
			if (i+j)%2 == 0 {
				var r guestproto.ExecResult
				r, err = a.Exec(ctx, sb.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
				if err == nil && r.ExitCode == 0 {
					hostExec = append(hostExec, time.Since(t0))
				}
			} else {
				var r pandastack.ExecResult
				r, err = sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
				if err == nil && r.ExitCode == 0 {
					apiExec = append(apiExec, time.Since(t0))
				}
			}
			if err != nil {
				return res, fmt.Errorf("exec: %w", err)
			}
		}
	}
	res.HostExec, res.APIExec = Summarize(hostExec), Summarize(apiExec)
	if res.HostExec.P50 > 0 {
		res.APIOverExec = round2(res.APIExec.P50 / res.HostExec.P50)
	}
	return res, nil
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
