package main

import (
	"context"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/bench"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// serverRSSBound is the documented bound (docs/operations.md) of the
// growth of the server's memory while 20 buffered execs of 16 MiB each
// run at once: they hold at most the output budget (256 MiB) in their
// buffers, plus what the Go heap adds around it.
const serverRSSBound = 640 // MiB above its memory before them

// TestLoad: 100 creates at once, each with its first exec, all succeed
// with the default timeouts (on 2 cores they queue); then 20 buffered
// execs of 16 MiB at once keep the server's memory bounded.
func TestLoad(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	// Longer than other tests: 320 MiB of output crosses 20 emulated VMs'
	// serial channels (about 5 MB/s each under TCG) on 2 shared cores.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := startServer(t, "load", dir)
	admin := s.client(t)
	k, err := admin.CreateKey(ctx, "load", false, pandastack.Quotas{MaxSandboxes: 128})
	if err != nil {
		t.Fatal(err)
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: s.URL(), APIKey: k.Key})
	if err != nil {
		t.Fatal(err)
	}
	res, err := bench.LoadBench(ctx, c, bench.LoadOptions{Creates: 100, BigExecs: 20, BigExecMiB: 16, ServerPID: s.PID()})
	t.Logf("creates: %d ok, all ready in %.1f s (p50 %.0f ms, p99 %.0f ms); large execs: %d ok, p50 %.0f ms; server memory %.0f MiB before, %.0f MiB peak",
		res.Creates.OK, res.Creates.AllReadyMS/1000, res.Creates.P50MS, res.Creates.P99MS, res.BigExecsOK, res.BigExecs.P50,
		res.ServerRSSBeforeMiB, res.ServerRSSPeakMiB)
	if err != nil {
		t.Fatalf("load: %v\ncreate errors: %v\nexec errors: %v", err, res.Creates.Errors, res.BigExecErrs)
	}
	if res.Creates.OK != 100 || res.BigExecsOK != 20 {
		t.Errorf("%d creates and %d large execs succeeded, want 100 and 20", res.Creates.OK, res.BigExecsOK)
	}
	if growth := res.ServerRSSPeakMiB - res.ServerRSSBeforeMiB; res.ServerRSSPeakMiB == 0 || growth > serverRSSBound {
		t.Errorf("server memory grew by %.0f MiB (%.0f → %.0f) during 20 × 16 MiB buffered execs, want at most %d MiB",
			growth, res.ServerRSSBeforeMiB, res.ServerRSSPeakMiB, serverRSSBound)
	}
	mustStop(t, s)
}
