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

// TestBenchVolume: `panda bench volume --json` with tiny counts runs
// through against the code world's server (its template has python3, which
// the benchmark's guest side uses), from inside its network namespace, and
// reports every figure as a positive number; the volumes it made (its own
// and its forks' branches) are gone afterwards. No timing is asserted.
func TestBenchVolume(t *testing.T) {
	w := codeWorld(t)
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+secShared.env.Host.Path, bin, "bench", "volume", "--json",
		"--api-url", w.URL(), "--api-key", w.AdminKey(), "--template", codeTemplate,
		"--memory", fmt.Sprint(codeMemoryMiB), "--file-mib", "8", "--runs", "1", "--files", "100",
		"--n", "1", "--fork-count", "2", "--fork-runs", "1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("panda bench volume: %v\n%s", err, stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	wantPositive(t, got,
		"volume_write.p50_mb_s", "rootfs_write.p50_mb_s", "write_ratio_p50",
		"volume_read.p50_mb_s", "rootfs_read.p50_mb_s", "read_ratio_p50",
		"volume_meta_ops_s", "rootfs_meta_ops_s", "meta_ratio",
		"create_with_volume.p50_ms", "create_plain.p50_ms", "create_ratio_p50",
		"fork_with_volume.p50_ms", "fork_plain.p50_ms", "fork_ratio_p50",
		"fork_branch.p50_ms", "fork_share.p50_ms", "branch_ratio_p50", "memory_mib")
	vols, err := w.client(t, w.AdminKey()).Volumes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols {
		if len(v.Name) > 6 && v.Name[:6] == "bench-" {
			t.Errorf("volume %s (parent %q) left behind by the benchmark", v.Name, v.Parent)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}
