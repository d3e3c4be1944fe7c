package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// TemplateOptions configures TemplateBench.
type TemplateOptions struct {
	// From is the Dockerfile's FROM (default "base", the built-in root
	// filesystem).
	From string
	// Dockerfile replaces the default build: its last line must be a RUN
	// step, which the rebuild changes (an echo appended). "" for the
	// default, three RUN steps of a few seconds each (see
	// DefaultTemplateSteps).
	Dockerfile string
	MemoryMiB  int // of the sandboxes measured (0: the server's default)
	// N is the creates measured per template (each create → first exec),
	// alternating between the built template and its FROM.
	N int
	// TTLSeconds bounds the life of every sandbox created (default 900).
	TTLSeconds int
	Log        io.Writer
}

// DefaultTemplateSteps are the RUN steps of the default build: work of the
// kind a template build does (write data, unpack and index files),
// seconds each under TCG, with no network.
var DefaultTemplateSteps = []string{
	"RUN head -c 48m /dev/urandom > /opt/blob && sha256sum /opt/blob > /opt/blob.sha256",
	"RUN mkdir -p /opt/tree && cp -a /usr/lib/python3.11 /opt/tree/ && find /opt/tree -type f -name '*.py' | sort | xargs cat | sha256sum > /opt/tree.sha256",
	"RUN echo ready > /opt/last",
}

// TemplateResult is the output of `panda bench template`.
type TemplateResult struct {
	APIURL     string `json:"api_url"`
	From       string `json:"from"`
	Dockerfile string `json:"dockerfile"`
	// ColdBuildS is a build with nothing cached after FROM; RebuildS the
	// same build with only its last RUN step changed (the steps before
	// it come from the layer cache); RebuildRatio = RebuildS/ColdBuildS
	// (target ≤ 0.25).
	ColdBuildS   float64 `json:"cold_build_s"`
	RebuildS     float64 `json:"rebuild_s"`
	RebuildRatio float64 `json:"rebuild_ratio"`
	CachedSteps  int     `json:"rebuild_cached_steps"`
	// FirstCreateS is the first create from the built template: it bakes
	// the template (a cold boot and a snapshot).
	FirstCreateS float64 `json:"first_create_s"`
	// Create → first exec from the built template and from its FROM,
	// measured alternately in one run; CreateRatio = built/from at p50
	// (target ≤ 1.10).
	CreateBuilt Dist    `json:"create_to_first_exec_built"`
	CreateFrom  Dist    `json:"create_to_first_exec_from"`
	CreateRatio float64 `json:"create_ratio"`
}

// TemplateBench builds a template from a Dockerfile through the API of a
// running server (the Go SDK), rebuilds it with its last step changed, and
// compares create → first exec of sandboxes from it with its FROM's. The
// template (named bench-<run id>), its versions and every sandbox are
// removed before it returns, also on errors and when ctx is cancelled.
func TemplateBench(ctx context.Context, c *pandastack.Client, o TemplateOptions) (res TemplateResult, err error) {
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	if o.From == "" {
		o.From = "base"
	}
	if o.N < 1 {
		o.N = 10
	}
	if o.TTLSeconds == 0 {
		o.TTLSeconds = 900
	}
	id := runID()
	df := o.Dockerfile
	if df == "" {
		// The run's id in the first step: nothing of an earlier run is
		// reused.
		steps := slices.Clone(DefaultTemplateSteps)
		steps[0] = strings.Replace(steps[0], "RUN ", "RUN echo "+id+" > /opt/bench-run && ", 1)
		df = "FROM " + o.From + "\n" + strings.Join(steps, "\n") + "\n"
	}
	lines := strings.Split(strings.TrimRight(df, "\n"), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); !strings.HasPrefix(strings.ToUpper(last), "RUN ") {
		return res, fmt.Errorf("the Dockerfile's last line must be a RUN step (the rebuild changes it): %q", last)
	}
	// The last step changed: its command plus an echo.
	rebuilt := strings.TrimRight(df, "\n") + " && echo rebuilt > /opt/bench-rebuilt\n"
	name := "bench-" + id
	res = TemplateResult{APIURL: c.APIURL(), From: o.From, Dockerfile: df}

	built := &apiRun{c: c, label: map[string]string{"panda_bench": id}, ids: map[string]bool{},
		opts: APIOptions{Template: name, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	from := &apiRun{c: c, label: built.label, ids: map[string]bool{},
		opts: APIOptions{Template: o.From, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	madeTemplate := false
	defer func() {
		cerr := errors.Join(built.cleanup(), from.cleanup())
		if madeTemplate {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if derr := c.DeleteTemplate(dctx, name, true); derr != nil && !errors.Is(derr, pandastack.ErrNotFound) {
				cerr = errors.Join(cerr, fmt.Errorf("delete template %s: %w", name, derr))
			}
		}
		if cerr != nil && err == nil {
			err = cerr
		}
	}()

	build := func(what, text string) (time.Duration, string, error) {
		logf("%s build of %s", what, name)
		var log strings.Builder
		t0 := time.Now()
		madeTemplate = true
		b, err := c.BuildTemplateFromDockerfile(ctx, name, text, "", func(l string) {
			log.WriteString(l + "\n")
			if o.Log != nil {
				fmt.Fprintln(o.Log, "  "+l)
			}
		})
		d := time.Since(t0)
		if err != nil {
			return d, log.String(), fmt.Errorf("%s build: %w (%s)", what, err, b.Error)
		}
		return d, log.String(), nil
	}
	cold, _, err := build("cold", df)
	if err != nil {
		return res, err
	}
	warm, log, err := build("changed-last-step", rebuilt)
	if err != nil {
		return res, err
	}
	res.ColdBuildS, res.RebuildS = secs(cold), secs(warm)
	res.RebuildRatio = ratio(res.RebuildS, res.ColdBuildS)
	res.CachedSteps = strings.Count(log, "  cached")
	logf("cold build %.1f s, rebuild %.1f s (%.2f of it, %d steps from the cache)", res.ColdBuildS, res.RebuildS, res.RebuildRatio, res.CachedSteps)

	// Warm both: the first create of each bakes its template.
	for i, r := range []*apiRun{built, from} {
		t0 := time.Now()
		sb, _, err := r.create(ctx)
		if err != nil {
			return res, fmt.Errorf("first create from %s: %w", r.opts.Template, err)
		}
		if i == 0 {
			res.FirstCreateS = secs(time.Since(t0))
		}
		if err := r.firstExec(ctx, sb); err != nil {
			return res, err
		}
		if err := r.kill(ctx, sb); err != nil {
			return res, err
		}
	}
	var db, df2 []time.Duration
	for i := range o.N {
		for _, builtFirst := range order(i) {
			r, out := from, &df2
			if builtFirst {
				r, out = built, &db
			}
			t0 := time.Now()
			sb, _, err := r.create(ctx)
			if err != nil {
				return res, fmt.Errorf("create from %s: %w", r.opts.Template, err)
			}
			if err := r.firstExec(ctx, sb); err != nil {
				return res, err
			}
			*out = append(*out, time.Since(t0))
			if err := r.kill(ctx, sb); err != nil {
				return res, err
			}
		}
	}
	res.CreateBuilt, res.CreateFrom = Summarize(db), Summarize(df2)
	res.CreateRatio = ratio(res.CreateBuilt.P50, res.CreateFrom.P50)
	return res, nil
}

func secs(d time.Duration) float64 { return round(d.Seconds()) }
