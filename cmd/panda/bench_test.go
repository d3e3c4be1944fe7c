package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/pandastack/pandastack/internal/testing/testkit"
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
	got, stdout := runBenchJSON(ctx, t, "net", "--data-dir", dir, "--images", testkit.Images(),
		"--template", "tiny", "--memory", "256", "--n", "3", "--mib", "4", "--transfers", "2", "--requests", "10")
	wantPositive(t, got,
		"create_to_first_exec_off.p50_ms", "create_to_first_exec_off.p99_ms",
		"create_to_first_exec_on.p50_ms", "create_to_first_exec_on.p99_ms", "create_ratio",
		"fork_to_child_exec_off.p50_ms", "fork_to_child_exec_off.p99_ms",
		"fork_to_child_exec_on.p50_ms", "fork_to_child_exec_on.p99_ms", "fork_ratio",
		"download.p50_mb_s", "upload.p50_mb_s",
		"direct.p50_us", "direct.p99_us", "proxy.p50_us", "proxy.p99_us",
	)
	if _, ok := got["proxy_overhead_p50_us"].(float64); !ok {
		t.Errorf("proxy_overhead_p50_us: got %v, want a number", got["proxy_overhead_p50_us"])
	}
	if t.Failed() {
		t.Logf("output:\n%s", stdout)
	}
	for name := range benchNamespaces() {
		if !before[name] {
			t.Errorf("namespace %s left behind", name)
		}
	}
}

// runBenchJSON runs `panda bench NAME --json ARGS...` and returns its
// output, decoded and as printed.
func runBenchJSON(ctx context.Context, t *testing.T, name string, args ...string) (map[string]any, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, append([]string{"bench", name, "--json"}, args...), &stdout, &stderr); err != nil {
		t.Fatalf("panda bench %s: %v\n%s", name, err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("panda bench %s: output is not JSON: %v\n%s", name, err, stdout.String())
	}
	return got, stdout.String()
}

// noVMMLeft fails t if a QEMU process of the benchmark data directory
// DIR/bench is still running.
func noVMMLeft(t *testing.T, dir string) {
	t.Helper()
	if pids := testkit.QEMUProcs(filepath.Join(dir, "bench")); len(pids) != 0 {
		t.Errorf("QEMU processes left by the benchmark: %v", pids)
	}
}

// wantPositive checks that each key (a dotted path into got) is a
// positive number.
func wantPositive(t *testing.T, got map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		var v any = got
		for _, part := range strings.Split(k, ".") {
			m, _ := v.(map[string]any)
			v = m[part]
		}
		if f, ok := v.(float64); !ok || f <= 0 {
			t.Errorf("%s: got %v, want a positive number", k, v)
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

// TestBenchExecE2B: `panda bench exec --json` against a real server runs
// its E2B section (the pinned e2b JS SDK through e2e/e2b/bench.mjs next
// to the Go SDK) and reports every distribution and both ratios as
// positive numbers. No timing is asserted.
func TestBenchExecE2B(t *testing.T) {
	e2e(t)
	e2bDir, err := filepath.Abs("../../e2e/e2b")
	if err != nil {
		t.Fatal(err)
	}
	node, _ := exec.LookPath("node")
	if why := bench.E2BMissing(node, e2bDir); why != "" {
		t.Fatalf("%s (make setup installs node; npm ci in e2e/e2b installs the SDK)", why)
	}
	srv := startServer(t, "server", newDataDir(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err = run(ctx, []string{"bench", "exec", "--json", "--api-url", srv.URL(), "--api-key", srv.AdminKey(),
		"--template", "base", "--memory", "256", "--n", "2", "--e2b-n", "2", "--e2b-dir", e2bDir}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("panda bench exec: %v\n%s", err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	wantPositive(t, got,
		"keystroke_echo.p50_ms", "start_to_first_byte.p50_ms", "attach_to_first_byte.p50_ms",
		"e2b.e2b.p50_ms", "e2b.e2b.p99_ms", "e2b.pandastack.p50_ms", "e2b.pandastack.p99_ms",
		"e2b.pandastack_login.p50_ms", "e2b.pandastack_login.p99_ms",
		"e2b.ratio_p50", "e2b.ratio_p50_same_command", "e2b.memory_mib",
	)
	if e, _ := got["e2b"].(map[string]any); e["skipped"] != nil || e["e2b_sdk_version"] == "" {
		t.Errorf("e2b section: skipped %v, SDK version %v", e["skipped"], e["e2b_sdk_version"])
	}
	if t.Failed() {
		t.Logf("output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// TestBenchExecE2BSkippedText: a skipped E2B section says why in the
// text output.
func TestBenchExecE2BSkippedText(t *testing.T) {
	var buf bytes.Buffer
	printExecResult(&buf, bench.ExecResult{E2B: &bench.E2BResult{Skipped: "node is not installed (not in PATH)"}})
	if want := "E2B SDK comparison: skipped: node is not installed"; !strings.Contains(buf.String(), want) {
		t.Errorf("output %q does not contain %q", buf.String(), want)
	}
}

// TestBenchTailLabel: a distribution of fewer than 100 runs shows its
// tail as "max", 100 or more as "p99".
func TestBenchTailLabel(t *testing.T) {
	var buf bytes.Buffer
	printExecResult(&buf, bench.ExecResult{
		KeystrokeEcho:     bench.Dist{N: 20, P50: 1, P99: 9, Max: 9},
		StartToFirstByte:  bench.Dist{N: 200, P50: 2, P99: 8, Max: 12},
		AttachToFirstByte: bench.Dist{N: 99, P50: 3, P99: 7, Max: 7},
	})
	for _, want := range []string{
		"keystroke → echo (WebSocket):   p50     1.0 ms  max     9.0 ms  (n=20)",
		"background start → first byte:  p50     2.0 ms  p99     8.0 ms  (n=200)",
		"attach → first byte:            p50     3.0 ms  max     7.0 ms  (n=99)",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, buf.String())
		}
	}
}

// TestBenchDensity: `panda bench density` starts the idle sandboxes it is
// asked for, reports each figure, and leaves no VMM behind.
func TestBenchDensity(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got, stdout := runBenchJSON(ctx, t, "density", "--data-dir", dir, "--images", testkit.Images(),
		"--template", "tiny", "--memory", "256", "--n", "3", "--settle", "100ms", "--window", "300ms", "--sample", "2", "--rounds", "2")
	wantPositive(t, got, "sandboxes", "asked", "create_seconds", "pss_mib_per_sandbox", "private_mib_per_sandbox",
		"exec_p50_ms", "exec_p99_ms", "exec.n", "host_cpus")
	if got["sandboxes"] != float64(3) || got["exec"].(map[string]any)["n"] != float64(4) {
		t.Errorf("sandboxes %v, exec.n %v: want 3 and 4 (2 sampled × 2 rounds)", got["sandboxes"], got["exec"].(map[string]any)["n"])
	}
	for _, k := range []string{"cpu_pct_of_core_per_sandbox", "vmm_cpu_pct_of_core_per_sandbox", "agent_cpu_pct_of_core", "host_cpu_pct_of_core_baseline", "host_cpu_pct_of_core_all_idle", "mem_available_drop_mib_per_sandbox"} {
		if _, ok := got[k].(float64); !ok {
			t.Errorf("%s: got %v, want a number", k, got[k])
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", stdout)
	}
	noVMMLeft(t, dir)
}

// TestBenchCreate: `panda bench create` reports create → first exec and
// the CPU the sandbox's VMM used until then (its vCPU's part of it, at
// most the whole), and leaves no VMM behind.
func TestBenchCreate(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got, stdout := runBenchJSON(ctx, t, "create", "--data-dir", dir, "--images", testkit.Images(),
		"--template", "tiny", "--memory", "256", "--n", "2", "--execs", "2", "--idle", "1")
	wantPositive(t, got, "p50_ms", "exec_p50_ms", "pss_mib_per_sandbox", "create_to_first_exec.n",
		"first_exec_vcpu_cpu.n", "first_exec_vcpu_cpu.p50_ms", "first_exec_vmm_cpu.p50_ms")
	v, _ := got["first_exec_vcpu_cpu"].(map[string]any)
	vm, _ := got["first_exec_vmm_cpu"].(map[string]any)
	// The whole VMM's figure has clock-tick resolution (10 ms).
	if lo, _ := v["min_ms"].(float64); lo > 0 {
		if hi, _ := vm["max_ms"].(float64); lo > hi+10 {
			t.Errorf("vCPU CPU %v ms above the whole VMM's %v ms", lo, hi)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", stdout)
	}
	noVMMLeft(t, dir)
}

func TestBenchPath(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	got, _ := runBenchJSON(ctx, t, "path", "--data-dir", dir, "--images", testkit.Images(),
		"--template", "tiny", "--memory", "256", "--n", "2", "--execs", "3", "--python-sdk", "../../sdk/python/src")
	wantPositive(t, got, "host_create_first_exec.n", "api_create_first_exec.n", "host_create_first_exec.p50_ms", "api_create_first_exec.p50_ms",
		"host_exec.p50_ms", "api_exec.p50_ms", "api_over_host_create_p50", "api_over_host_exec_p50",
		"python_create_first_exec.p50_ms", "python_exec.p50_ms", "python_over_host_create_p50", "python_over_host_exec_p50")
	for _, k := range []string{"api_exec", "python_exec"} {
		if n := got[k].(map[string]any)["n"]; n != float64(3) {
			t.Errorf("%s.n %v, want 3", k, n)
		}
	}
	if n := got["python_create_first_exec"].(map[string]any)["n"]; n != float64(2) {
		t.Errorf("python_create_first_exec.n %v, want 2", n)
	}
	noVMMLeft(t, dir)
	// A directory without the SDK is refused before anything starts.
	var out bytes.Buffer
	err := run(ctx, []string{"bench", "path", "--data-dir", dir, "--images", testkit.Images(), "--python-sdk", t.TempDir()}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "no pandastack package") {
		t.Errorf("bench path --python-sdk EMPTY: %v, want an error naming the missing package", err)
	}
}

// TestBenchFork: `panda bench fork` with tiny counts measures fork →
// first exec, the fan-out and the memory of forked against naive
// children, reports each figure, and leaves no VMM behind.
func TestBenchFork(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	got, stdout := runBenchJSON(ctx, t, "fork", "--data-dir", dir, "--images", testkit.Images(),
		"--template", "tiny", "--sizes", "256", "--rounds", "1", "--dirty", "2", "--fanout", "2", "--fanout-runs", "1",
		"--memory", "256", "--mem-children", "2", "--child-dirty", "2")
	wantPositive(t, got, "fanout.count", "fanout.all_ready.n", "fanout.all_ready.p50_ms",
		"memory.children", "memory.idle_sandbox_pss_mib", "memory.budget_mib", "memory.fork_added_pss_mib",
		"memory.naive_added_pss_mib", "memory.fork_ms", "memory.naive_fork_ms")
	sizes, _ := got["by_memory_size"].([]any)
	if len(sizes) != 1 {
		t.Fatalf("by_memory_size: got %v, want one size", got["by_memory_size"])
	}
	wantPositive(t, sizes[0].(map[string]any), "memory_mib", "fork_to_first_exec.n", "fork_to_first_exec.p50_ms", "parent_pause.p50_ms", "dirty_mib")
	if t.Failed() {
		t.Logf("output:\n%s", stdout)
	}
	noVMMLeft(t, dir)
}

// TestBenchTemplate: `panda bench template` with a Dockerfile of its
// own builds it twice (the second time from the layer cache but for its
// last step), compares creates from it and from its FROM, reports each
// figure, and removes the template it built.
func TestBenchTemplate(t *testing.T) {
	e2e(t)
	srv := startServer(t, "server", newDataDir(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	df := filepath.Join(t.TempDir(), "Dockerfile")
	// The rebuild appends a write to /opt, which tiny does not have.
	if err := os.WriteFile(df, []byte("FROM tiny\nRUN mkdir -p /opt && echo one > /opt/one\nRUN echo two > /opt/two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, stdout := runBenchJSON(ctx, t, "template", "--api-url", srv.URL(), "--api-key", srv.AdminKey(),
		"--file", df, "--n", "1", "--memory", "256")
	wantPositive(t, got, "cold_build_s", "rebuild_s", "rebuild_cached_steps", "first_create_s",
		"create_to_first_exec_built.n", "create_to_first_exec_from.n", "create_ratio")
	ts, err := srv.client(t).Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		if strings.HasPrefix(tp.Name, "bench-") {
			t.Errorf("template %s left behind", tp.Name)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", stdout)
	}
}
