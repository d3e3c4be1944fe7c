package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// APIOptions configures APIBench.
type APIOptions struct {
	Template  string // "" lets the server choose
	MemoryMiB int    // 0 lets the server choose
	N         int    // sequential creates measured
	Execs     int    // execs of `true` measured in one warm sandbox
	// Concurrency lists the batch sizes to measure. 1 stands for the
	// sequential measurements (always made); each c > 1 is one batch of c
	// creates started at once.
	Concurrency []int
	// TTLSeconds bounds the life of every sandbox the benchmark creates,
	// in case it is killed before it can clean up (default 900).
	TTLSeconds int
	// Volumes are mounted in every sandbox the run creates.
	Volumes []pandastack.VolumeMount
	Log     io.Writer
}

// APIResult is the output of `panda bench api`.
type APIResult struct {
	APIURL    string `json:"api_url"`
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	// Create → first successful exec of `true`, sequential, as a client
	// sees it (POST /v1/sandboxes, then POST .../exec).
	CreateToFirstExec Dist `json:"create_to_first_exec"`
	// The create request alone (it answers once the sandbox is running).
	Create Dist `json:"create"`
	// Round trip of `true` in a warm sandbox.
	Exec Dist `json:"exec"`
	// One batch per concurrency level above 1.
	Concurrent []ConcurrentResult `json:"concurrent"`
}

// ConcurrentResult is one batch of creates started at once.
type ConcurrentResult struct {
	Concurrency int `json:"concurrency"`
	// AllReadyMS is the time from the start of the batch until every
	// sandbox of it had answered its first exec.
	AllReadyMS float64 `json:"all_ready_ms"`
	// P50MS and P99MS are the per-sandbox times from the start of the
	// batch to its first successful exec (P99MS: the maximum when fewer
	// than 100 succeeded; TailName(OK) names it).
	P50MS  float64  `json:"p50_ms"`
	P99MS  float64  `json:"p99_ms"`
	OK     int      `json:"ok"`
	Failed int      `json:"failed"`
	Errors []string `json:"errors,omitempty"`
}

// ErrBatchFailed is returned (wrapped) by APIBench, with the full result,
// when some creates of a concurrent batch failed.
var ErrBatchFailed = errors.New("some sandboxes of a concurrent batch failed")

// APIBench measures the API of a running server through the Go SDK:
// sequential create → first exec, exec round trips in a warm sandbox, and
// batches of concurrent creates. Every sandbox it creates carries the
// metadata label panda_bench=<run id> and is killed before it returns,
// also when ctx is cancelled or a step fails.
func APIBench(ctx context.Context, c *pandastack.Client, o APIOptions) (res APIResult, err error) {
	logf := logTo(o.Log)
	if o.TTLSeconds == 0 {
		o.TTLSeconds = 900
	}
	res = APIResult{APIURL: c.APIURL(), Template: o.Template, MemoryMiB: o.MemoryMiB, Concurrent: []ConcurrentResult{}}
	run := &apiRun{c: c, label: map[string]string{"panda_bench": runID()}, opts: o, ids: map[string]bool{}}
	defer func() {
		if cerr := run.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	logf("warming up (the first create bakes the template if needed)")
	sb, _, err := run.create(ctx)
	if err != nil {
		return res, fmt.Errorf("warm-up create: %w", err)
	}
	res.Template, res.MemoryMiB = sb.Info.Template, sb.Info.MemoryMiB
	if err := run.kill(ctx, sb); err != nil {
		return res, err
	}

	var total, creates []time.Duration
	for i := range o.N {
		t0 := time.Now()
		sb, tCreate, err := run.create(ctx)
		if err != nil {
			return res, fmt.Errorf("create %d: %w", i, err)
		}
		if err := run.firstExec(ctx, sb); err != nil {
			return res, fmt.Errorf("first exec in %s: %w", sb.ID, err)
		}
		total = append(total, time.Since(t0))
		creates = append(creates, tCreate)
		if err := run.kill(ctx, sb); err != nil {
			return res, err
		}
		if (i+1)%10 == 0 {
			logf("create %d/%d", i+1, o.N)
		}
	}
	res.CreateToFirstExec = Summarize(total)
	res.Create = Summarize(creates)

	if o.Execs > 0 {
		sb, _, err := run.create(ctx)
		if err != nil {
			return res, fmt.Errorf("create for execs: %w", err)
		}
		var execs []time.Duration
		for i := range o.Execs + 5 {
			t0 := time.Now()
			r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("true exited %d", r.ExitCode)
			}
			if err != nil {
				return res, fmt.Errorf("exec in %s: %w", sb.ID, err)
			}
			if i >= 5 { // the first execs translate code paths for the first time
				execs = append(execs, time.Since(t0))
			}
		}
		res.Exec = Summarize(execs)
		if err := run.kill(ctx, sb); err != nil {
			return res, err
		}
	}

	levels := append([]int(nil), o.Concurrency...)
	sort.Ints(levels)
	failed := 0
	for _, n := range levels {
		if n <= 1 {
			continue
		}
		logf("%d concurrent creates", n)
		cr, err := run.batch(ctx, n, false)
		if err != nil {
			return res, err
		}
		if err := ctx.Err(); err != nil {
			return res, err // interrupted: the failures are ours
		}
		res.Concurrent = append(res.Concurrent, cr)
		failed += cr.Failed
	}
	if failed > 0 {
		return res, fmt.Errorf("%w: %d failed", ErrBatchFailed, failed)
	}
	return res, nil
}

// apiRun tracks the sandboxes of one benchmark run.
type apiRun struct {
	c     *pandastack.Client
	label map[string]string
	opts  APIOptions

	mu  sync.Mutex
	ids map[string]bool // created and not yet killed
}

func runID() string {
	return fmt.Sprintf("%x", time.Now().UnixNano())
}

// create creates one sandbox and remembers it for cleanup.
func (r *apiRun) create(ctx context.Context) (*pandastack.Sandbox, time.Duration, error) {
	t0 := time.Now()
	sb, err := r.c.Create(ctx, pandastack.CreateOptions{
		Template: r.opts.Template, MemoryMiB: r.opts.MemoryMiB, TTLSeconds: r.opts.TTLSeconds, Metadata: r.label,
		Volumes: r.opts.Volumes,
	})
	d := time.Since(t0)
	if err != nil {
		return nil, d, err
	}
	r.mu.Lock()
	r.ids[sb.ID] = true
	r.mu.Unlock()
	return sb, d, nil
}

// firstExec runs `true` until it succeeds: a sandbox that the server says
// is running should take it at once, but a conflict (still starting) is
// retried for up to 30 s.
func (r *apiRun) firstExec(ctx context.Context, sb *pandastack.Sandbox) error {
	return r.firstExecArgv(ctx, sb, []string{"true"})
}

// firstExecArgv is firstExec of argv, which must exit 0.
func (r *apiRun) firstExecArgv(ctx context.Context, sb *pandastack.Sandbox, argv []string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := sb.Exec(ctx, pandastack.Command{Argv: argv})
		if err == nil {
			if res.ExitCode != 0 {
				return fmt.Errorf("%q exited %d", argv, res.ExitCode)
			}
			return nil
		}
		if !errors.Is(err, pandastack.ErrConflict) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (r *apiRun) kill(ctx context.Context, sb *pandastack.Sandbox) error {
	if err := sb.Kill(ctx); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
		return fmt.Errorf("kill %s: %w", sb.ID, err)
	}
	r.mu.Lock()
	delete(r.ids, sb.ID)
	r.mu.Unlock()
	return nil
}

// batch starts n creates at once and waits until each has answered its
// first exec (or failed), then kills them all unless keep.
func (r *apiRun) batch(ctx context.Context, n int, keep bool) (ConcurrentResult, error) {
	cr := ConcurrentResult{Concurrency: n}
	type outcome struct {
		sb  *pandastack.Sandbox
		d   time.Duration // from the start of the batch to ready
		err error
	}
	out := make([]outcome, n)
	start := make(chan struct{})
	var t0 time.Time // written before start is closed, read after
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			sb, _, err := r.create(ctx)
			if err == nil {
				if err = r.firstExec(ctx, sb); err != nil {
					err = fmt.Errorf("first exec in %s: %w", sb.ID, err)
				}
			}
			out[i] = outcome{sb: sb, d: time.Since(t0), err: err}
		}()
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	allReady := time.Since(t0)

	var ready []time.Duration
	for _, o := range out {
		if o.err != nil {
			cr.Failed++
			cr.Errors = append(cr.Errors, o.err.Error())
			continue
		}
		cr.OK++
		ready = append(ready, o.d)
	}
	d := Summarize(ready)
	cr.P50MS, cr.P99MS = d.P50, d.P99
	cr.AllReadyMS = round(float64(allReady.Microseconds()) / 1000)
	if keep {
		return cr, nil
	}

	// Kill the batch, in parallel too.
	var (
		kmu  sync.Mutex
		kerr error
		kwg  sync.WaitGroup
	)
	for _, o := range out {
		if o.sb == nil {
			continue
		}
		kwg.Add(1)
		go func() {
			defer kwg.Done()
			if err := r.kill(ctx, o.sb); err != nil {
				kmu.Lock()
				kerr = errors.Join(kerr, err)
				kmu.Unlock()
			}
		}()
	}
	kwg.Wait()
	return cr, kerr
}

// live lists the sandboxes created and not killed, in no order.
func (r *apiRun) live() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.ids))
	for id := range r.ids {
		out = append(out, id)
	}
	return out
}

// cleanup kills every sandbox this run created and did not kill, plus any
// sandbox carrying its label (a create whose answer was lost to a
// cancellation may still have succeeded on the server). It runs with its
// own context: it must work after ctx was cancelled.
func (r *apiRun) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.mu.Lock()
	ids := make([]string, 0, len(r.ids))
	for id := range r.ids {
		ids = append(ids, id)
	}
	r.mu.Unlock()
	seen := map[string]bool{}
	var errs error
	killOne := func(id string) {
		if seen[id] {
			return
		}
		seen[id] = true
		if err := r.c.Sandbox(id).Kill(ctx); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
			errs = errors.Join(errs, fmt.Errorf("clean up sandbox %s: %w", id, err))
		}
	}
	for _, id := range ids {
		killOne(id)
	}
	list, err := r.c.List(ctx, pandastack.ListOptions{Metadata: r.label})
	if err != nil {
		return errors.Join(errs, fmt.Errorf("list the benchmark's sandboxes for clean-up: %w", err))
	}
	for _, sb := range list {
		killOne(sb.ID)
	}
	return errs
}
