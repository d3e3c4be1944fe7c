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
	pr := &pathRun{a: a, c: c, o: o, logf: logTo(o.Log),
		req:  hostagent.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs},
		opts: pandastack.CreateOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, VCPUs: o.VCPUs, TTLSeconds: 600}}
	if o.Python != nil {
		if err := o.Python.start(ctx, o); err != nil {
			return res, err
		}
		defer o.Python.stop()
	}
	creates, err := pr.creates(ctx)
	if err != nil {
		return res, err
	}
	res.HostCreate, res.APICreate, res.APIOverCreate, res.PythonCreate, res.PythonOverCreate = creates.summary(o.Python != nil)
	execs, err := pr.execs(ctx)
	if err != nil {
		return res, err
	}
	res.HostExec, res.APIExec, res.APIOverExec, res.PythonExec, res.PythonOverExec = execs.summary(o.Python != nil)
	return res, nil
}

// pathRun is one PathBench.
type pathRun struct {
	a    *hostagent.Agent
	c    *pandastack.Client
	o    PathOptions
	req  hostagent.CreateRequest  // a create on the host path
	opts pandastack.CreateOptions // a create on the API path
	logf func(format string, args ...any)
}

// pathSamples are one measurement's samples on each path.
type pathSamples struct{ host, api, py []time.Duration }

// summary is the distributions of the samples of the host and API paths,
// and the API's p50 over the host's; with python, also the Python SDK's
// distribution and p50 over the host's (else nil and 0).
func (s pathSamples) summary(python bool) (host, api Dist, apiOver float64, py *Dist, pyOver float64) {
	host, api = Summarize(s.host), Summarize(s.api)
	apiOver = ratioP50(api, host)
	if python {
		d := Summarize(s.py)
		py, pyOver = &d, ratioP50(d, host)
	}
	return host, api, apiOver, py, pyOver
}

// interleave runs round i of paths: each once, the first being path i
// modulo their number.
func interleave(i int, paths []func() error) error {
	for j := range paths {
		if err := paths[(i+j)%len(paths)](); err != nil {
			return err
		}
	}
	return nil
}

// creates measures create → first exec on each path, o.N rounds
// interleaved, after one unmeasured round that warms every path (a bake
// if needed, the page cache, connections).
func (pr *pathRun) creates(ctx context.Context) (pathSamples, error) {
	var s pathSamples
	record := false
	paths := []func() error{
		func() error {
			d, id, err := pr.viaHost(ctx)
			if id != "" {
				pr.a.Kill(ctx, id)
			}
			if err != nil {
				return fmt.Errorf("host path: %w", err)
			}
			if record {
				s.host = append(s.host, d)
			}
			return nil
		},
		func() error {
			d, sb, err := pr.viaAPI(ctx)
			if sb != nil {
				sb.Kill(ctx)
			}
			if err != nil {
				return fmt.Errorf("api path: %w", err)
			}
			if record {
				s.api = append(s.api, d)
			}
			return nil
		},
	}
	if pr.o.Python != nil {
		paths = append(paths, func() error {
			d, err := pr.o.Python.call(map[string]string{"op": "create"})
			if err != nil {
				return fmt.Errorf("python SDK path: %w", err)
			}
			if record {
				s.py = append(s.py, d)
			}
			return nil
		})
	}
	pr.logf("warming up (bakes the template if needed)")
	for _, create := range paths {
		if err := create(); err != nil {
			return s, err
		}
	}
	record = true
	for i := range pr.o.N {
		if err := interleave(i, paths); err != nil {
			return s, err
		}
		if (i+1)%10 == 0 {
			pr.logf("create %d/%d", i+1, pr.o.N)
		}
	}
	return s, nil
}

// viaHost creates a sandbox through the agent and runs its first exec;
// it returns the time both took and the sandbox's id, once it has one.
func (pr *pathRun) viaHost(ctx context.Context) (time.Duration, string, error) {
	t0 := time.Now()
	info, err := pr.a.Create(ctx, pr.req)
	if err != nil {
		return 0, "", err
	}
	r, err := pr.a.Exec(ctx, info.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", r.ExitCode)
	}
	return time.Since(t0), info.ID, err
}

// viaAPI creates a sandbox through the API and runs its first exec; it
// returns the time both took and the sandbox, once it exists.
func (pr *pathRun) viaAPI(ctx context.Context) (time.Duration, *pandastack.Sandbox, error) {
	t0 := time.Now()
	sb, err := pr.c.Create(ctx, pr.opts)
	if err != nil {
		return 0, nil, err
	}
	err = execTrue(ctx, sb)
	return time.Since(t0), sb, err
}

// execs measures exec round trips of true in one sandbox on each path,
// o.Execs rounds interleaved; an exec that exits non-zero is not counted.
func (pr *pathRun) execs(ctx context.Context) (pathSamples, error) {
	var s pathSamples
	sb, err := pr.c.Create(ctx, pr.opts)
	if err != nil {
		return s, err
	}
	defer sb.Kill(context.WithoutCancel(ctx))
	paths := []func() error{
		func() error {
			t0 := time.Now()
			r, err := pr.a.Exec(ctx, sb.ID, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
			if err == nil && r.ExitCode == 0 {
				s.host = append(s.host, time.Since(t0))
			}
			return err
		},
		func() error {
			t0 := time.Now()
			r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
			if err == nil && r.ExitCode == 0 {
				s.api = append(s.api, time.Since(t0))
			}
			return err
		},
	}
	if pr.o.Python != nil {
		paths = append(paths, func() error {
			d, err := pr.o.Python.call(map[string]string{"op": "exec", "id": sb.ID})
			if err == nil {
				s.py = append(s.py, d)
			}
			return err
		})
	}
	for i := range pr.o.Execs {
		if err := interleave(i, paths); err != nil {
			return s, fmt.Errorf("exec: %w", err)
		}
	}
	return s, nil
}

// ratioP50 is d's p50 over base's, to two decimals (0 without a base).
func ratioP50(d, base Dist) float64 {
	if base.P50 <= 0 {
		return 0
	}
	return round2(d.P50 / base.P50)
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }
