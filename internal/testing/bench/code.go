package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// CodeOptions configures CodeBench.
type CodeOptions struct {
	// Template is the code interpreter's template (default
	// code-interpreter); BaseTemplate the one whose create → first exec is
	// the yardstick (default base). Both are created with MemoryMiB (0:
	// the server's default).
	Template     string
	BaseTemplate string
	MemoryMiB    int
	N            int // sequential creates measured, of each template
	Runs         int // round trips of 1+1 (and of exec true) in one warm sandbox
	Charts       int // matplotlib charts drawn
	Forks        int // forks measured, of each kind (child's first cell, child's first exec)
	Imports      int // import pandas, in the warm default context and in fresh ones
	// TTLSeconds bounds the life of every sandbox the benchmark creates,
	// in case it is killed before it can clean up (default 900).
	TTLSeconds int
	Log        io.Writer
}

// CodeResult is the output of `panda bench code`. Every *Ratio is the
// code interpreter's p50 over its yardstick's p50, measured in the same
// run (these machines are noisy: compare ratios).
type CodeResult struct {
	APIURL       string `json:"api_url"`
	Template     string `json:"template"`
	BaseTemplate string `json:"base_template"`
	MemoryMiB    int    `json:"memory_mib"`
	// Create → the first run_code("1+1") answered 2, on Template; and
	// create → first exec of true on BaseTemplate.
	CreateToFirstCode Dist    `json:"create_to_first_code"`
	CreateToFirstExec Dist    `json:"create_to_first_exec"`
	CreateRatioP50    float64 `json:"create_ratio_p50"`
	// Round trips in one warm sandbox of Template: run_code("1+1") and
	// exec of true.
	RunCode         Dist    `json:"run_code"`
	Exec            Dist    `json:"exec"`
	RunCodeRatioP50 float64 `json:"run_code_ratio_p50"`
	// A matplotlib line chart to its PNG (and chart data).
	Chart Dist `json:"chart"`
	// Fork (of a sandbox whose kernel holds a DataFrame) → the child's
	// first run_code that reads it; and fork → the child's first exec.
	ForkToChildCode Dist    `json:"fork_to_child_code"`
	ForkToChildExec Dist    `json:"fork_to_child_exec"`
	ForkRatioP50    float64 `json:"fork_ratio_p50"`
	// The cell `import pandas` in the default context (baked warm: the
	// module is loaded already) and in a fresh context (its kernel
	// started cold), and the create of that fresh context.
	ImportPandasWarm  Dist `json:"import_pandas_warm"`
	ImportPandasFresh Dist `json:"import_pandas_fresh"`
	CreateContext     Dist `json:"create_context"`
}

// CodeBench measures the code interpreter of a running server through the
// Go SDK, next to the exec path it is compared with. Every sandbox it
// creates carries the label panda_bench=<run id> and is killed before it
// returns, also when ctx is cancelled or a step fails.
func CodeBench(ctx context.Context, c *pandastack.Client, o CodeOptions) (res CodeResult, err error) {
	logf := logTo(o.Log)
	if o.Template == "" {
		o.Template = "code-interpreter"
	}
	if o.BaseTemplate == "" {
		o.BaseTemplate = "base"
	}
	if o.TTLSeconds == 0 {
		o.TTLSeconds = 900
	}
	res = CodeResult{APIURL: c.APIURL(), Template: o.Template, BaseTemplate: o.BaseTemplate, MemoryMiB: o.MemoryMiB}
	label := map[string]string{"panda_bench": runID()}
	code := &apiRun{c: c, label: label, ids: map[string]bool{},
		opts: APIOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	base := &apiRun{c: c, label: label, ids: map[string]bool{},
		opts: APIOptions{Template: o.BaseTemplate, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	defer func() {
		for _, r := range []*apiRun{code, base} {
			if cerr := r.cleanup(); cerr != nil && err == nil {
				err = cerr
			}
		}
	}()

	// Warm-ups: the first create of each template bakes it if needed.
	for _, r := range []*apiRun{code, base} {
		logf("warming up %s (the first create bakes the template if needed)", r.opts.Template)
		sb, _, err := r.create(ctx)
		if err != nil {
			return res, fmt.Errorf("warm-up create of %s: %w", r.opts.Template, err)
		}
		if r == code {
			res.MemoryMiB = sb.Info.MemoryMiB
			if _, err := firstCode(ctx, sb); err != nil {
				return res, fmt.Errorf("warm-up cell in %s: %w", sb.ID, err)
			}
		}
		if err := r.kill(ctx, sb); err != nil {
			return res, err
		}
	}

	// Create → first cell and create → first exec, interleaved so that
	// both see the same machine.
	var toCode, toExec []time.Duration
	for i := range o.N {
		t0 := time.Now()
		sb, _, err := code.create(ctx)
		if err != nil {
			return res, fmt.Errorf("create %d of %s: %w", i, o.Template, err)
		}
		if _, err := firstCode(ctx, sb); err != nil {
			return res, fmt.Errorf("first cell in %s: %w", sb.ID, err)
		}
		toCode = append(toCode, time.Since(t0))
		if err := code.kill(ctx, sb); err != nil {
			return res, err
		}

		t0 = time.Now()
		sb, _, err = base.create(ctx)
		if err != nil {
			return res, fmt.Errorf("create %d of %s: %w", i, o.BaseTemplate, err)
		}
		if err := base.firstExec(ctx, sb); err != nil {
			return res, fmt.Errorf("first exec in %s: %w", sb.ID, err)
		}
		toExec = append(toExec, time.Since(t0))
		if err := base.kill(ctx, sb); err != nil {
			return res, err
		}
		if (i+1)%5 == 0 {
			logf("create %d/%d", i+1, o.N)
		}
	}
	res.CreateToFirstCode, res.CreateToFirstExec = Summarize(toCode), Summarize(toExec)
	res.CreateRatioP50 = ratio(res.CreateToFirstCode.P50, res.CreateToFirstExec.P50)

	// The warm sandbox of the rest.
	sb, _, err := code.create(ctx)
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	if _, err := firstCode(ctx, sb); err != nil {
		return res, fmt.Errorf("first cell in %s: %w", sb.ID, err)
	}

	logf("%d round trips of run_code(1+1) and of exec true", o.Runs)
	var runs, execs []time.Duration
	for i := range o.Runs + 5 {
		t0 := time.Now()
		if err := cellIs(ctx, sb, "1+1", "2"); err != nil {
			return res, err
		}
		d := time.Since(t0)
		t0 = time.Now()
		r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		if err != nil {
			return res, fmt.Errorf("exec in %s: %w", sb.ID, err)
		}
		if i >= 5 { // the first ones translate code paths for the first time
			runs, execs = append(runs, d), append(execs, time.Since(t0))
		}
	}
	res.RunCode, res.Exec = Summarize(runs), Summarize(execs)
	res.RunCodeRatioP50 = ratio(res.RunCode.P50, res.Exec.P50)

	logf("%d matplotlib charts", o.Charts)
	const chart = "import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2, 3], [4, 1, 9], label='y')\nplt.title('t')\nplt.show()"
	var charts []time.Duration
	for i := range o.Charts + 1 {
		t0 := time.Now()
		ex, err := sb.RunCode(ctx, chart, pandastack.RunCodeOptions{})
		if err != nil {
			return res, fmt.Errorf("chart cell in %s: %w", sb.ID, err)
		}
		if ex.Error != nil {
			return res, fmt.Errorf("chart cell in %s: %v", sb.ID, ex.Error)
		}
		if !hasPNG(ex) {
			return res, fmt.Errorf("chart cell in %s: no PNG among %d results", sb.ID, len(ex.Results))
		}
		if i > 0 { // the first chart loads the font cache and the renderer
			charts = append(charts, time.Since(t0))
		}
	}
	res.Chart = Summarize(charts)

	logf("%d imports of pandas, warm and fresh", o.Imports)
	var warm, fresh, contexts []time.Duration
	for range o.Imports {
		t0 := time.Now()
		if err := cellIs(ctx, sb, "import pandas\npandas.__name__", "'pandas'"); err != nil {
			return res, err
		}
		warm = append(warm, time.Since(t0))
		t0 = time.Now()
		cc, err := sb.CreateCodeContext(ctx, pandastack.CodeContextOptions{Language: "python"})
		if err != nil {
			return res, fmt.Errorf("create a context in %s: %w", sb.ID, err)
		}
		contexts = append(contexts, time.Since(t0))
		t0 = time.Now()
		ex, err := sb.RunCode(ctx, "import pandas\npandas.__name__", pandastack.RunCodeOptions{ContextID: cc.ID})
		if err == nil && (ex.Error != nil || ex.Text() != "'pandas'") {
			err = fmt.Errorf("import pandas in a fresh context: %s", describe(ex))
		}
		if err != nil {
			return res, err
		}
		fresh = append(fresh, time.Since(t0))
		if err := sb.RemoveCodeContext(ctx, cc.ID); err != nil {
			return res, fmt.Errorf("remove context %s: %w", cc.ID, err)
		}
	}
	res.ImportPandasWarm, res.ImportPandasFresh, res.CreateContext = Summarize(warm), Summarize(fresh), Summarize(contexts)

	logf("%d forks to a child's first cell, %d to a child's first exec", o.Forks, o.Forks)
	if err := cellIs(ctx, sb, "import pandas as pd\ndf = pd.DataFrame({'x': range(100000)})\nlen(df)", "100000"); err != nil {
		return res, err
	}
	var forkCode, forkExec []time.Duration
	for i := range o.Forks {
		for _, viaCode := range []bool{true, false} {
			t0 := time.Now()
			kids, err := sb.Fork(ctx, 1)
			if err != nil {
				return res, fmt.Errorf("fork %d of %s: %w", i, sb.ID, err)
			}
			child := kids[0]
			code.track(child.ID)
			if viaCode {
				err = cellIs(ctx, child, "int(df['x'].sum())", "4999950000")
			} else {
				err = code.firstExec(ctx, child)
			}
			if err != nil {
				return res, fmt.Errorf("fork child %s: %w", child.ID, err)
			}
			if viaCode {
				forkCode = append(forkCode, time.Since(t0))
			} else {
				forkExec = append(forkExec, time.Since(t0))
			}
			if err := code.kill(ctx, child); err != nil {
				return res, err
			}
		}
	}
	res.ForkToChildCode, res.ForkToChildExec = Summarize(forkCode), Summarize(forkExec)
	res.ForkRatioP50 = ratio(res.ForkToChildCode.P50, res.ForkToChildExec.P50)
	return res, code.kill(ctx, sb)
}

// firstCode runs 1+1 until it answers: a sandbox the server calls running
// takes it at once, but a conflict (still starting) is retried for up to
// 30 s, as firstExec does.
func firstCode(ctx context.Context, sb *pandastack.Sandbox) (time.Duration, error) {
	t0 := time.Now()
	deadline := t0.Add(30 * time.Second)
	for {
		err := cellIs(ctx, sb, "1+1", "2")
		if err == nil {
			return time.Since(t0), nil
		}
		if !errors.Is(err, pandastack.ErrConflict) || time.Now().After(deadline) {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cellIs runs code in sb's default Python context and checks that its
// main result's text is want.
func cellIs(ctx context.Context, sb *pandastack.Sandbox, code, want string) error {
	ex, err := sb.RunCode(ctx, code, pandastack.RunCodeOptions{})
	if err != nil {
		return fmt.Errorf("run %q in %s: %w", code, sb.ID, err)
	}
	if ex.Error != nil || ex.Text() != want {
		return fmt.Errorf("run %q in %s: want %s, got %s", code, sb.ID, want, describe(ex))
	}
	return nil
}

// describe says what a cell did, for errors.
func describe(ex *pandastack.Execution) string {
	if ex.Error != nil {
		return fmt.Sprintf("%s: %s", ex.Error.Name, ex.Error.Value)
	}
	return fmt.Sprintf("the result %q", ex.Text())
}

// pngMagic starts every PNG file.
var pngMagic = []byte("\x89PNG\r\n\x1a\n")

func hasPNG(ex *pandastack.Execution) bool {
	for _, r := range ex.Results {
		if bytes.HasPrefix(r.PNG, pngMagic) {
			return true
		}
	}
	return false
}

// track remembers a sandbox the run did not create itself (a fork's
// child) so that cleanup kills it.
func (r *apiRun) track(id string) {
	r.mu.Lock()
	r.ids[id] = true
	r.mu.Unlock()
}
