package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/bench"
	"github.com/pandastack/pandastack/internal/vmm"
	"github.com/spf13/cobra"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure PandaStack (medians and p99s)"}
	cmd.AddCommand(benchCreateCmd())
	return cmd
}

func benchCreateCmd() *cobra.Command {
	var (
		dataDir, images, accel, tmpl string
		n, execs, idle, mem, vcpus   int
		asJSON                       bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create → first exec latency, exec round trip and idle memory, through the host agent",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if images == "" {
				images = filepath.Join(dataDir, "images")
			}
			// Its own data directory (next to the server's) so that a
			// running server and the benchmark never share sandboxes.
			a, err := agent.Open(ctx, agent.Config{
				DataDir: filepath.Join(dataDir, "bench"), ImagesDir: images, Accel: vmm.Accel(accel),
				Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				return err
			}
			defer a.Close()
			log := cmd.ErrOrStderr()
			res, err := bench.CreateBench(ctx, a, bench.CreateOptions{
				Template: tmpl, MemoryMiB: mem, VCPUs: vcpus, N: n, Execs: execs, Idle: idle, Log: log,
			})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "template %s, %d MiB, %s\n", res.Template, res.MemoryMiB, res.Accel)
			fmt.Fprintf(out, "create → first exec: p50 %.1f ms  p99 %.1f ms  (n=%d)\n", res.Create.P50, res.Create.P99, res.Create.N)
			fmt.Fprintf(out, "restore (agent ready): p50 %.1f ms  p99 %.1f ms\n", res.Restore.P50, res.Restore.P99)
			fmt.Fprintf(out, "exec true: p50 %.1f ms  p99 %.1f ms  (n=%d)\n", res.Exec.P50, res.Exec.P99, res.Exec.N)
			if res.IdleSandboxes > 0 {
				fmt.Fprintf(out, "idle PSS: %.1f MiB per sandbox (%d sandboxes, private %.1f MiB each)\n",
					res.PSSMiBPerSandbox, res.IdleSandboxes, res.PrivateMiBPerSbx)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", envOr("PANDA_DATA_DIR", "/var/lib/pandastack"), "data directory (the benchmark uses DATA_DIR/bench)")
	f.StringVar(&images, "images", "", "guest images directory (default DATA_DIR/images)")
	f.StringVar(&accel, "accel", "auto", "auto, kvm or tcg")
	f.StringVar(&tmpl, "template", "base", "template")
	f.IntVar(&mem, "memory", 1024, "guest memory in MiB")
	f.IntVar(&vcpus, "vcpus", 1, "vCPUs")
	f.IntVar(&n, "n", 50, "sequential creates to measure")
	f.IntVar(&execs, "execs", 100, "exec round trips to measure")
	f.IntVar(&idle, "idle", 20, "idle sandboxes whose memory is measured")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
