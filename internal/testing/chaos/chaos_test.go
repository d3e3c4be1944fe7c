package chaos_test

// The fault-injection suite against real deployments: `panda up`, and
// `panda server` with `panda agent`, with real QEMU guests under TCG. Each
// run uses a random seed, printed when it fails, so that CI explores and a
// failure can be replayed with `panda chaos --seed S [--split]`.
//
// Environment: PANDA_BIN (default: go build ./cmd/panda), PANDA_TEST_IMAGES
// (default /var/lib/pandastack/images). Needs root. Skipped with -short.

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/chaos"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// e2e gates an end-to-end test (real processes, real VMs; root, since
// panda loop-mounts an XFS image) and returns the panda binary.
func e2e(t *testing.T) string {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// logWriter keeps the last lines written to it, for a failure report,
// and with -v also sends each to t.Log. (Not every line into the test's
// output: a report that starts with hundreds of iteration lines buries
// its cause where a truncated CI log cuts it off.)
type logWriter struct {
	t     *testing.T
	mu    sync.Mutex
	buf   []byte
	lines []string
}

const logWriterKeep = 30

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		if testing.Verbose() {
			w.t.Log(line)
		}
		if w.lines = append(w.lines, line); len(w.lines) > logWriterKeep {
			w.lines = w.lines[1:]
		}
		w.buf = w.buf[i+1:]
	}
}

// last is the last lines written, one per line.
func (w *logWriter) last() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.lines, "\n")
}

// runChaos runs the suite as cfg says and checks that it passed and did
// what a run must do to mean something: every kind of operation, faults,
// crashes at failpoints, restarts, checks after every iteration.
func runChaos(t *testing.T, cfg chaos.Config) chaos.Report {
	t.Helper()
	cfg.Bin = e2e(t)
	cfg.Images = testkit.Images()
	lw := &logWriter{t: t}
	cfg.Log = lw
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	rep, err := chaos.Run(ctx, cfg)
	var sum strings.Builder
	rep.WriteText(&sum)
	if err != nil {
		// The cause first: the violation, the iterations before it, the
		// processes' warnings and errors; then the ends of their logs and
		// the report.
		t.Fatalf("%v\nreplay: panda chaos --seed %d%s --iterations %d\n--- the last iterations ---\n%s\n%s--- report ---\n%s",
			err, rep.Seed, map[bool]string{true: " --split"}[cfg.Split]+map[bool]string{true: " --network"}[cfg.Network], cfg.Iterations,
			lw.last(), rep.Logs, sum.String())
	}
	t.Logf("report:\n%s", sum.String())
	if rep.Iterations != cfg.Iterations {
		t.Errorf("ran %d iterations, want %d", rep.Iterations, cfg.Iterations)
	}
	if rep.Checks < rep.Iterations {
		t.Errorf("%d invariant checks passed in %d iterations, want one per iteration at least", rep.Checks, rep.Iterations)
	}
	for _, kind := range []string{"create", "exec", "write", "fork", "snapshot", "pause", "resume", "kill", "ttl", "volume_write"} {
		if o := rep.Ops[kind]; o["ok"] == 0 {
			t.Errorf("no %s succeeded (%v): the run did not exercise it", kind, o)
		}
	}
	if rep.VolumeChecks == 0 {
		t.Error("no volume's acknowledged writes were checked")
	}
	faults, hits, restarts := 0, 0, 0
	for _, n := range rep.Faults {
		faults += n
	}
	for _, n := range rep.FailpointsHit {
		hits += n
	}
	for _, n := range rep.Restarts {
		restarts += n
	}
	if faults == 0 || hits == 0 || restarts == 0 || rep.ContentChecks == 0 {
		t.Errorf("faults %d, failpoints hit %d, restarts %d, sandboxes probed %d: want some of each", faults, hits, restarts, rep.ContentChecks)
	}
	return rep
}

// TestChaosUp: 200 iterations against `panda up`, with sandbox networking
// (in namespaces the run makes).
func TestChaosUp(t *testing.T) {
	rep := runChaos(t, chaos.Config{Iterations: 200, Network: true})
	if rep.Faults["kill-server"] == 0 || rep.Faults["kill-qemu"] == 0 {
		t.Errorf("faults %v: want server and QEMU kills", rep.Faults)
	}
}

// TestChaosSplit: 60 iterations against `panda server` + `panda agent`.
func TestChaosSplit(t *testing.T) {
	rep := runChaos(t, chaos.Config{Iterations: 60, Split: true})
	if rep.Restarts["agent"] == 0 || rep.Restarts["server"] == 0 {
		t.Errorf("restarts %v: want both the agent and the server restarted", rep.Restarts)
	}
}
