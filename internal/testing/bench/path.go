package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// PathOptions configures PathBench.
type PathOptions struct {
	Template  string
	MemoryMiB int
	VCPUs     int
	N         int // rounds of create → first exec on each path
	Execs     int // exec round trips on each path
	// Python, if set, adds a third path: the same API through the Python
	// SDK (its own costs included), interleaved with the other two.
	Python *PythonSDK
	Log    io.Writer
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
	// The Python SDK's path (PathOptions.Python), and its p50s over the
	// host path's.
	PythonCreate     *Dist   `json:"python_create_first_exec,omitempty"`
	PythonOverCreate float64 `json:"python_over_host_create_p50,omitempty"`
	PythonExec       *Dist   `json:"python_exec,omitempty"`
	PythonOverExec   float64 `json:"python_over_host_exec_p50,omitempty"`
}

// PathBench measures create → first exec and exec round trips through the
// host agent a and through the API client c over the same agent (and the
// Python SDK's, if o.Python), interleaving the paths round by round (which
// goes first rotates too).
func PathBench(ctx context.Context, a *hostagent.Agent, c *pandastack.Client, o PathOptions) (PathResult, error) {
	res := PathResult{Template: o.Template, MemoryMiB: o.MemoryMiB, Accel: string(a.Accel())}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	req := hostagent.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs}
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
	viaPython := func() (time.Duration, error) { return o.Python.call(map[string]string{"op": "create"}) }
	if o.Python != nil {
		if err := o.Python.start(ctx, o); err != nil {
			return res, err
		}
		defer o.Python.stop()
	}
	var host, api, py []time.Duration
	creates := []func(record bool) error{
		func(record bool) error {
			d, id, err := viaHost()
			if id != "" {
				a.Kill(ctx, id)
			}
			if err != nil {
				return fmt.Errorf("host path: %w", err)
			}
			if record {
				host = append(host, d)
			}
			return nil
		},
		func(record bool) error {
			d, sb, err := viaAPI()
			if sb != nil {
				sb.Kill(ctx)
			}
			if err != nil {
				return fmt.Errorf("api path: %w", err)
			}
			if record {
				api = append(api, d)
			}
			return nil
		},
	}
	if o.Python != nil {
		creates = append(creates, func(record bool) error {
			d, err := viaPython()
			if err != nil {
				return fmt.Errorf("python SDK path: %w", err)
			}
			if record {
				py = append(py, d)
			}
			return nil
		})
	}
	// Warm every path (a bake if needed, the page cache, connections).
	logf("warming up (bakes the template if needed)")
	for _, create := range creates {
		if err := create(false); err != nil {
			return res, err
		}
	}
	for i := range o.N {
		for j := range creates {
			if err := creates[(i+j)%len(creates)](true); err != nil {
				return res, err
			}
		}
		if (i+1)%10 == 0 {
			logf("create %d/%d", i+1, o.N)
		}
	}
	res.HostCreate, res.APICreate = Summarize(host), Summarize(api)
	res.APIOverCreate = ratioP50(res.APICreate, res.HostCreate)
	if o.Python != nil {
		d := Summarize(py)
		res.PythonCreate, res.PythonOverCreate = &d, ratioP50(d, res.HostCreate)
	}
	// Exec round trips in one sandbox, both paths alternating.
	sb, err := c.Create(ctx, opts)
	if err != nil {
		return res, err
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	var hostExec, apiExec, pyExec []time.Duration
	execs := []func() error{
		func() error {
			t0 := time.Now()
			r, err := a.Exec(ctx, sb.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
			if err == nil && r.ExitCode == 0 {
				hostExec = append(hostExec, time.Since(t0))
			}
			return err
		},
		func() error {
			t0 := time.Now()
			r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
			if err == nil && r.ExitCode == 0 {
				apiExec = append(apiExec, time.Since(t0))
			}
			return err
		},
	}
	if o.Python != nil {
		execs = append(execs, func() error {
			d, err := o.Python.call(map[string]string{"op": "exec", "id": sb.ID})
			if err == nil {
				pyExec = append(pyExec, d)
			}
			return err
		})
	}
	for i := range o.Execs {
		for j := range execs {
			if err := execs[(i+j)%len(execs)](); err != nil {
				return res, fmt.Errorf("exec: %w", err)
			}
		}
	}
	res.HostExec, res.APIExec = Summarize(hostExec), Summarize(apiExec)
	res.APIOverExec = ratioP50(res.APIExec, res.HostExec)
	if o.Python != nil {
		d := Summarize(pyExec)
		res.PythonExec, res.PythonOverExec = &d, ratioP50(d, res.HostExec)
	}
	return res, nil
}

// ratioP50 is d's p50 over base's, to two decimals (0 without a base).
func ratioP50(d, base Dist) float64 {
	if base.P50 <= 0 {
		return 0
	}
	return round2(d.P50 / base.P50)
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
