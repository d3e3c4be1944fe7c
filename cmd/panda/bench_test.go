package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/pandatest"
)

// TestBenchNet: `panda bench net --json` with tiny counts runs through in
// its own namespaces, reports every figure as a positive number, and
// leaves no namespace, mount or VM behind.
func TestBenchNet(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := benchNamespaces()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"bench", "net", "--json", "--data-dir", dir, "--images", pandatest.Images(),
		"--template", "tiny", "--memory", "256", "--n", "3", "--mib", "4", "--transfers", "2", "--requests", "10"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("panda bench net: %v\n%s", err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	for _, k := range []string{
		"create_to_first_exec_off.p50_ms", "create_to_first_exec_off.p99_ms",
		"create_to_first_exec_on.p50_ms", "create_to_first_exec_on.p99_ms", "create_ratio",
		"fork_to_child_exec_off.p50_ms", "fork_to_child_exec_off.p99_ms",
		"fork_to_child_exec_on.p50_ms", "fork_to_child_exec_on.p99_ms", "fork_ratio",
		"download.p50_mb_s", "upload.p50_mb_s",
		"direct.p50_us", "direct.p99_us", "proxy.p50_us", "proxy.p99_us",
	} {
		var v any = got
		for _, part := range strings.Split(k, ".") {
			m, _ := v.(map[string]any)
			v = m[part]
		}
		if f, ok := v.(float64); !ok || f <= 0 {
			t.Errorf("%s: got %v, want a positive number", k, v)
		}
	}
	if _, ok := got["proxy_overhead_p50_us"].(float64); !ok {
		t.Errorf("proxy_overhead_p50_us: got %v, want a number", got["proxy_overhead_p50_us"])
	}
	if t.Failed() {
		t.Logf("output:\n%s", stdout.String())
	}
	for name := range benchNamespaces() {
		if !before[name] {
			t.Errorf("namespace %s left behind", name)
		}
	}
}

// benchNamespaces lists the named namespaces `panda bench net` makes:
// its network manager's ("nb<hex>-<hex>").
func benchNamespaces() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "nb") {
			out[e.Name()] = true
		}
	}
	return out
}
