package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
)

// TestBenchCode: `panda bench code --json` with tiny counts runs through
// against the code world's server (from inside its network namespace, as
// a client there would) and reports every distribution and ratio as a
// positive number. No timing is asserted.
func TestBenchCode(t *testing.T) {
	w := codeWorld(t)
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+secShared.env.Host.Path, bin, "bench", "code", "--json",
		"--api-url", w.URL(), "--api-key", w.AdminKey(), "--template", codeTemplate, "--base", "tiny",
		"--memory", fmt.Sprint(codeMemoryMiB), "--n", "1", "--runs", "1", "--charts", "1", "--forks", "1", "--imports", "1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("panda bench code: %v\n%s", err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	wantPositive(t, got,
		"create_to_first_code.p50_ms", "create_to_first_exec.p50_ms", "create_ratio_p50",
		"run_code.p50_ms", "exec.p50_ms", "run_code_ratio_p50", "chart.p50_ms",
		"fork_to_child_code.p50_ms", "fork_to_child_exec.p50_ms", "fork_ratio_p50",
		"import_pandas_warm.p50_ms", "import_pandas_fresh.p50_ms", "create_context.p50_ms", "memory_mib")
	if t.Failed() {
		t.Logf("output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}
