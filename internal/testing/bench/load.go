package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// LoadOptions configures LoadBench.
type LoadOptions struct {
	Template  string // "" lets the server choose
	MemoryMiB int    // 0 lets the server choose
	// Creates is the number of creates started at once, each followed by
	// its first exec (default 100).
	Creates int
	// BigExecs buffered execs are run at once, each printing
	// BigExecMiB MiB (defaults 20 and 16).
	BigExecs   int
	BigExecMiB int
	// ServerPID is the server process whose memory is measured (0: not
	// measured).
	ServerPID  int
	TTLSeconds int // bounds every sandbox's life if the run dies (default 900)
	Log        io.Writer
}

// LoadResult is the output of `panda bench load`.
type LoadResult struct {
	Creates ConcurrentResult `json:"creates"`
	// BigExecs is the batch of large buffered execs: each one's time from
	// the start of the batch to its answer.
	BigExecs    Dist     `json:"big_execs"`
	BigExecMiB  int      `json:"big_exec_mib"`
	BigExecsOK  int      `json:"big_execs_ok"`
	BigExecErrs []string `json:"big_exec_errors,omitempty"`
	// The server's resident memory (VmRSS) before the batch of large
	// execs and its peak (VmHWM, reset before the batch) during it.
	ServerRSSBeforeMiB float64 `json:"server_rss_before_mib,omitempty"`
	ServerRSSPeakMiB   float64 `json:"server_rss_peak_mib,omitempty"`
}

// ErrLoadFailed is returned (wrapped), with the full result, when some
// operation of the load failed.
var ErrLoadFailed = errors.New("some operations of the load failed")

// LoadBench loads a running server: Creates creates at once (each then
// runs its first exec; on a small machine they queue, and none may fail),
// then BigExecs buffered execs at once in those sandboxes, each printing
// BigExecMiB MiB, while the server's peak memory is measured. Every
// sandbox is labelled panda_bench=<run id> and killed before it returns.
func LoadBench(ctx context.Context, c *pandastack.Client, o LoadOptions) (res LoadResult, err error) {
	logf := logTo(o.Log)
	if o.Creates == 0 {
		o.Creates = 100
	}
	if o.BigExecs == 0 {
		o.BigExecs = 20
	}
	if o.BigExecMiB == 0 {
		o.BigExecMiB = 16
	}
	if o.TTLSeconds == 0 {
		o.TTLSeconds = 900
	}
	res.BigExecMiB = o.BigExecMiB
	run := &apiRun{c: c, label: map[string]string{"panda_bench": runID()}, ids: map[string]bool{},
		opts: APIOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	defer func() {
		if cerr := run.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	logf("%d creates at once, each with its first exec", o.Creates)
	res.Creates, err = run.batch(ctx, o.Creates, true)
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	logf("creates: %d ok, %d failed, all ready in %.1f s", res.Creates.OK, res.Creates.Failed, res.Creates.AllReadyMS/1000)

	var sbs []*pandastack.Sandbox
	for _, id := range run.live() {
		sbs = append(sbs, c.Sandbox(id))
		if len(sbs) == o.BigExecs {
			break
		}
	}
	if len(sbs) < o.BigExecs {
		return res, fmt.Errorf("%w: only %d sandboxes for %d large execs", ErrLoadFailed, len(sbs), o.BigExecs)
	}
	if o.ServerPID > 0 {
		res.ServerRSSBeforeMiB, _ = procStatusMiB(o.ServerPID, "VmRSS")
		// "5" resets the peak (VmHWM) to the current RSS.
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", o.ServerPID), []byte("5"), 0); err != nil {
			return res, fmt.Errorf("reset the server's peak memory: %w", err)
		}
	}
	logf("%d buffered execs at once, %d MiB of output each", o.BigExecs, o.BigExecMiB)
	// NUL bytes: cheap for the guest to make, and the costliest output to
	// encode (each is \u0000 in JSON, six bytes).
	cmd := fmt.Sprintf("head -c %d /dev/zero", o.BigExecMiB<<20)
	times := make([]time.Duration, len(sbs))
	errs := make([]error, len(sbs))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd, Timeout: 5 * time.Minute})
			switch {
			case err != nil:
			case r.ExitCode != 0:
				err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			case len(r.Stdout) != o.BigExecMiB<<20 && !r.Truncated:
				err = fmt.Errorf("got %d bytes of output, want %d", len(r.Stdout), o.BigExecMiB<<20)
			}
			errs[i], times[i] = err, time.Since(t0)
		}()
	}
	wg.Wait()
	var ok []time.Duration
	for i, err := range errs {
		if err != nil {
			res.BigExecErrs = append(res.BigExecErrs, fmt.Sprintf("%s: %v", sbs[i].ID, err))
			continue
		}
		ok = append(ok, times[i])
	}
	res.BigExecs, res.BigExecsOK = Summarize(ok), len(ok)
	if o.ServerPID > 0 {
		res.ServerRSSPeakMiB, _ = procStatusMiB(o.ServerPID, "VmHWM")
	}
	if res.Creates.Failed > 0 || len(res.BigExecErrs) > 0 {
		return res, fmt.Errorf("%w: %d creates, %d large execs", ErrLoadFailed, res.Creates.Failed, len(res.BigExecErrs))
	}
	return res, nil
}

// procStatusMiB reads a kB field of /proc/PID/status in MiB.
func procStatusMiB(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := strings.Cut(string(line), ":")
		if !ok || k != field {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			return 0, err
		}
		return round(kb / 1024), nil
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
