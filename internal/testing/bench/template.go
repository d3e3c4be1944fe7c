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
	logf := logTo(o.Log)
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
	df, rebuilt, err := benchDockerfiles(o, id)
	if err != nil {
		return res, err
	}
	name := "bench-" + id
	res = TemplateResult{APIURL: c.APIURL(), From: o.From, Dockerfile: df}

	built := &apiRun{c: c, label: map[string]string{"panda_bench": id}, ids: map[string]bool{},
		opts: APIOptions{Template: name, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	from := &apiRun{c: c, label: built.label, ids: map[string]bool{},
		opts: APIOptions{Template: o.From, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	tb := &templateBuilder{c: c, name: name, log: o.Log, logf: logf}
	defer func() {
		cerr := errors.Join(built.cleanup(), from.cleanup(), tb.cleanup())
		if cerr != nil && err == nil {
			err = cerr
		}
	}()

	cold, _, err := tb.build(ctx, "cold", df)
	if err != nil {
		return res, err
	}
	warm, log, err := tb.build(ctx, "changed-last-step", rebuilt)
	if err != nil {
		return res, err
	}
	res.ColdBuildS, res.RebuildS = secs(cold), secs(warm)
	res.RebuildRatio = ratio(res.RebuildS, res.ColdBuildS)
	res.CachedSteps = strings.Count(log, "  cached")
	logf("cold build %.1f s, rebuild %.1f s (%.2f of it, %d steps from the cache)", res.ColdBuildS, res.RebuildS, res.RebuildRatio, res.CachedSteps)

	if res.FirstCreateS, err = warmTemplates(ctx, built, from); err != nil {
		return res, err
	}
	db, df2, err := compareCreates(ctx, built, from, o.N)
	if err != nil {
		return res, err
	}
	res.CreateBuilt, res.CreateFrom = Summarize(db), Summarize(df2)
	res.CreateRatio = ratio(res.CreateBuilt.P50, res.CreateFrom.P50)
	return res, nil
}

// benchDockerfiles returns TemplateBench's Dockerfile (o.Dockerfile, or
// the default steps with the run's id in the first, so that nothing of an
// earlier run is reused) and the rebuild's, whose last step, which must
// be a RUN, gets an echo appended.
func benchDockerfiles(o TemplateOptions, id string) (df, rebuilt string, err error) {
	df = o.Dockerfile
	if df == "" {
		steps := slices.Clone(DefaultTemplateSteps)
		steps[0] = strings.Replace(steps[0], "RUN ", "RUN echo "+id+" > /opt/bench-run && ", 1)
		df = "FROM " + o.From + "\n" + strings.Join(steps, "\n") + "\n"
	}
	lines := strings.Split(strings.TrimRight(df, "\n"), "\n")
	if last := strings.TrimSpace(lines[len(lines)-1]); !strings.HasPrefix(strings.ToUpper(last), "RUN ") {
		return "", "", fmt.Errorf("the Dockerfile's last line must be a RUN step (the rebuild changes it): %q", last)
	}
	rebuilt = strings.TrimRight(df, "\n") + " && echo rebuilt > /opt/bench-rebuilt\n"
	return df, rebuilt, nil
}

// templateBuilder builds TemplateBench's template, and deletes it
// (cleanup) once a build was attempted.
type templateBuilder struct {
	c    *pandastack.Client
	name string
	log  io.Writer // the build's own log, indented; nil: none
	logf func(format string, args ...any)
	made bool
}

// build builds the template from the Dockerfile text; what names the build
// in the log and errors. It returns how long the build took and its log.
func (tb *templateBuilder) build(ctx context.Context, what, text string) (time.Duration, string, error) {
	tb.logf("%s build of %s", what, tb.name)
	var log strings.Builder
	t0 := time.Now()
	tb.made = true
	b, err := tb.c.BuildTemplateFromDockerfile(ctx, tb.name, text, "", func(l string) {
		log.WriteString(l + "\n")
		if tb.log != nil {
			fmt.Fprintln(tb.log, "  "+l)
		}
	})
	d := time.Since(t0)
	if err != nil {
		return d, log.String(), fmt.Errorf("%s build: %w (%s)", what, err, b.Error)
	}
	return d, log.String(), nil
}

// cleanup deletes the template with its versions, within a minute, if a
// build was attempted.
func (tb *templateBuilder) cleanup() error {
	if !tb.made {
		return nil
	}
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if derr := tb.c.DeleteTemplate(dctx, tb.name, true); derr != nil && !errors.Is(derr, pandastack.ErrNotFound) {
		return fmt.Errorf("delete template %s: %w", tb.name, derr)
	}
	return nil
}

// warmTemplates creates a sandbox from each template in turn and runs its
// first exec: the first create of each bakes its template. It returns how
// long the built template's create took, in seconds.
func warmTemplates(ctx context.Context, built, from *apiRun) (firstCreateS float64, err error) {
	for i, r := range []*apiRun{built, from} {
		t0 := time.Now()
		sb, _, err := r.create(ctx)
		if err != nil {
			return firstCreateS, fmt.Errorf("first create from %s: %w", r.opts.Template, err)
		}
		if i == 0 {
			firstCreateS = secs(time.Since(t0))
		}
		if err := r.firstExec(ctx, sb); err != nil {
			return firstCreateS, err
		}
		if err := r.kill(ctx, sb); err != nil {
			return firstCreateS, err
		}
	}
	return firstCreateS, nil
}

// compareCreates measures create → first exec from built and from from,
// n rounds, alternating which goes first.
func compareCreates(ctx context.Context, built, from *apiRun, n int) (db, dfrom []time.Duration, err error) {
	for i := range n {
		for _, builtFirst := range order(i) {
			r, out := from, &dfrom
			if builtFirst {
				r, out = built, &db
			}
			t0 := time.Now()
			sb, _, err := r.create(ctx)
			if err != nil {
				return nil, nil, fmt.Errorf("create from %s: %w", r.opts.Template, err)
			}
			if err := r.firstExec(ctx, sb); err != nil {
				return nil, nil, err
			}
			*out = append(*out, time.Since(t0))
			if err := r.kill(ctx, sb); err != nil {
				return nil, nil, err
			}
		}
	}
	return db, dfrom, nil
}

func secs(d time.Duration) float64 { return round(d.Seconds()) }
