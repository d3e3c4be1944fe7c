package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// E2BScript is the Node side of E2BBench, in the e2b package directory
// (e2e/e2b), next to the node_modules holding the pinned SDK.
const E2BScript = "bench.mjs"

// E2BLoginArgv is the command E2B's SDK sends for commands.run('true'):
// it wraps every command in a login shell by its own choice.
var E2BLoginArgv = []string{"/bin/bash", "-l", "-c", "true"}

// E2BOptions configures E2BBench.
type E2BOptions struct {
	Template string // "" is base
	N        int    // iterations; each measures all three clients once
	// Node is the node executable; Dir the e2b package directory holding
	// E2BScript and node_modules/e2b (see E2BMissing).
	Node, Dir string
	// APIURL and APIKey are given to the E2B SDK as E2B_API_URL,
	// E2B_SANDBOX_URL and E2B_API_KEY.
	APIURL, APIKey string
	Log            io.Writer
}

// E2BResult is the E2B section of `panda bench exec`: create → first
// `true` through E2B's JS SDK and through PandaStack's Go SDK, in the
// same run, alternating.
type E2BResult struct {
	// Skipped says why the section was not measured; nothing else is set.
	Skipped    string `json:"skipped,omitempty"`
	SDKVersion string `json:"e2b_sdk_version,omitempty"`
	Template   string `json:"template,omitempty"`
	// MemoryMiB is the sandboxes' memory: the server's default, since an
	// E2B create cannot choose it; the Go SDK's creates ask for it too.
	MemoryMiB int `json:"memory_mib,omitempty"`
	// E2B is Sandbox.create + commands.run('true') (which runs
	// `bash -l -c true`), timed inside Node.
	E2B Dist `json:"e2b"`
	// PandaStack is the Go SDK's Create + Exec of argv ["true"] (the
	// server runs it directly; a Cmd string would be `bash -c`).
	PandaStack Dist `json:"pandastack"`
	// PandaStackLogin is the Go SDK's Create + Exec of E2BLoginArgv: the
	// same command E2B's SDK sends, so it isolates the protocol.
	PandaStackLogin Dist `json:"pandastack_login"`
	// Ratio is E2B.P50 / PandaStack.P50 (as each SDK runs `true`);
	// RatioLogin is E2B.P50 / PandaStackLogin.P50 (same command).
	Ratio      float64 `json:"ratio_p50"`
	RatioLogin float64 `json:"ratio_p50_same_command"`
}

// E2BMissing reports why the E2B comparison cannot run with node and the
// package directory dir, or "" if it can.
func E2BMissing(node, dir string) string {
	if node == "" {
		return "node is not installed (not in PATH)"
	}
	if _, err := os.Stat(filepath.Join(dir, E2BScript)); err != nil {
		return fmt.Sprintf("%s not found in %s (point --e2b-dir at e2e/e2b)", E2BScript, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		return fmt.Sprintf("the e2b package is not installed in %s (run npm ci there)", dir)
	}
	return ""
}

// e2bLine is one line printed by E2BScript.
type e2bLine struct {
	Ready      bool    `json:"ready"`
	SDKVersion string  `json:"sdk_version"`
	CreateMS   float64 `json:"create_ms"`
	RunMS      float64 `json:"run_ms"`
	TotalMS    float64 `json:"total_ms"`
	SandboxID  string  `json:"sandbox_id"`
	MemoryMiB  int     `json:"memory_mib"`
	Error      string  `json:"error"`
}

// parseE2BLine decodes one line of E2BScript's output; a line reporting
// an error, or a sample without a positive total, is an error.
func parseE2BLine(b []byte) (e2bLine, error) {
	var l e2bLine
	if err := json.Unmarshal(b, &l); err != nil {
		return l, fmt.Errorf("bad line from %s %q: %w", E2BScript, b, err)
	}
	if l.Error != "" {
		return l, fmt.Errorf("e2b SDK: %s", l.Error)
	}
	if !l.Ready && l.TotalMS <= 0 {
		return l, fmt.Errorf("bad line from %s %q: no total_ms", E2BScript, b)
	}
	return l, nil
}

// summarizeE2B fills the distributions and ratios of r from samples.
func summarizeE2B(r *E2BResult, e2b, ps, psLogin []time.Duration) {
	r.E2B, r.PandaStack, r.PandaStackLogin = Summarize(e2b), Summarize(ps), Summarize(psLogin)
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return float64(int(a/b*1000+0.5)) / 1000
	}
	r.Ratio = ratio(r.E2B.P50, r.PandaStack.P50)
	r.RatioLogin = ratio(r.E2B.P50, r.PandaStackLogin.P50)
}

// e2bNode is the running E2BScript.
type e2bNode struct{ *lineChild }

func (n e2bNode) next(cmd string) (e2bLine, error) {
	b, err := n.send(cmd)
	if err != nil {
		return e2bLine{}, err
	}
	return parseE2BLine(b)
}

func (n e2bNode) read() (e2bLine, error) {
	b, err := n.lineChild.read()
	if err != nil {
		return e2bLine{}, err
	}
	return parseE2BLine(b)
}

// E2BBench measures create → first `true` through E2B's JS SDK (run as a
// long-lived Node child that takes one "go" per iteration, so that Node's
// start-up is never measured) and through PandaStack's Go SDK, twice:
// argv ["true"] and E2B's own `bash -l -c true`. One warm-up of each
// comes first; then o.N iterations, the order of the three rotating from
// one iteration to the next. Every sandbox, of either SDK, carries the
// label panda_bench=<run id> and is killed before it returns.
func E2BBench(ctx context.Context, c *pandastack.Client, o E2BOptions) (res E2BResult, err error) {
	logf := logTo(o.Log)
	if o.Template == "" {
		o.Template = "base"
	}
	res.Template = o.Template
	label := map[string]string{"panda_bench": runID()}
	run := &apiRun{c: c, label: label, opts: APIOptions{Template: o.Template, TTLSeconds: 900}, ids: map[string]bool{}}
	defer func() {
		if cerr := run.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	meta, _ := json.Marshal(label)
	child, err := startLineChild(ctx, o.Dir, append(os.Environ(), "E2B_API_URL="+o.APIURL, "E2B_SANDBOX_URL="+o.APIURL, "E2B_API_KEY="+o.APIKey,
		"E2B_DOMAIN=", "E2B_DEBUG=", "BENCH_TEMPLATE="+o.Template, "BENCH_METADATA="+string(meta)), o.Node, E2BScript)
	if err != nil {
		return res, err
	}
	child.name = E2BScript
	defer child.stop() // EOF ends the script
	node := e2bNode{child}
	hello, err := node.read()
	if err != nil {
		return res, err
	}
	res.SDKVersion = hello.SDKVersion

	goSDK := func(argv []string) (time.Duration, error) {
		t0 := time.Now()
		sb, _, err := run.create(ctx)
		if err != nil {
			return 0, fmt.Errorf("create: %w", err)
		}
		if err := run.firstExecArgv(ctx, sb, argv); err != nil {
			return 0, fmt.Errorf("first exec of %q in %s: %w", argv, sb.ID, err)
		}
		d := time.Since(t0)
		if res.MemoryMiB == 0 {
			res.MemoryMiB = sb.Info.MemoryMiB
		}
		return d, run.kill(ctx, sb)
	}
	logf("e2b: warming up (E2B SDK %s, template %s)", res.SDKVersion, o.Template)
	w, err := node.next("go info")
	if err != nil {
		return res, fmt.Errorf("e2b warm-up: %w", err)
	}
	for _, argv := range [][]string{{"true"}, E2BLoginArgv} {
		if _, err := goSDK(argv); err != nil {
			return res, fmt.Errorf("go SDK warm-up: %w", err)
		}
	}
	if w.MemoryMiB != res.MemoryMiB {
		return res, fmt.Errorf("e2b's sandbox has %d MiB, the Go SDK's %d MiB: not comparable", w.MemoryMiB, res.MemoryMiB)
	}

	var e2b, ps, psLogin []time.Duration
	steps := []func() error{
		func() error {
			l, err := node.next("go")
			if err != nil {
				return err
			}
			e2b = append(e2b, time.Duration(l.TotalMS*float64(time.Millisecond)))
			return nil
		},
		func() error {
			d, err := goSDK([]string{"true"})
			ps = append(ps, d)
			return err
		},
		func() error {
			d, err := goSDK(E2BLoginArgv)
			psLogin = append(psLogin, d)
			return err
		},
	}
	for i := range o.N {
		for j := range steps {
			if err := steps[(i+j)%len(steps)](); err != nil {
				return res, fmt.Errorf("e2b comparison, iteration %d: %w", i, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
		if (i+1)%5 == 0 {
			logf("e2b: %d/%d", i+1, o.N)
		}
	}
	summarizeE2B(&res, e2b, ps, psLogin)
	return res, nil
}
