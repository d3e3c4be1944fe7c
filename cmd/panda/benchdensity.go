package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/pandastack/pandastack/internal/testing/bench"
)

func benchDensityCmd() *cobra.Command {
	var (
		loc                         localBench
		shape                       benchShape
		n, parallel, sample, rounds int
		reserve                     int
		settle, window              time.Duration
		asJSON                      bool
	)
	cmd := &cobra.Command{
		Use:   "density",
		Short: "Many idle sandboxes on this host: memory and CPU each costs while idle, exec round trip among them",
		Long: `Start --n idle sandboxes on a host agent of the benchmark's own (DATA_DIR/bench,
no network), --parallel at a time, each answering one exec; let them settle;
then measure, and kill them all (also on errors and Ctrl-C):

  - PSS and private memory of each sandbox's VMM process (all mappings)
  - the host's MemAvailable drop per sandbox
  - host CPU busy (/proc/stat) over --window with them all idle, minus the
    same before the first create, per sandbox, in % of one core; and,
    unaffected by other work on the host, the CPU time of the VMM
    processes themselves over that window per sandbox, and the host
    agent's (this process)
  - exec round trip of argv ["true"] in --sample of them, --rounds each

Creates stop early, and the result says so, when MemAvailable falls below
--reserve-mib: the benchmark never pushes the host into swap.`,
		Example: `  panda bench density --json
  panda bench density --template tiny --memory 256 --n 100 --window 10s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || parallel < 1 || sample < 1 || rounds < 1 {
				return fmt.Errorf("--n, --parallel, --sample and --rounds must be at least 1")
			}
			if window < 100*time.Millisecond {
				return fmt.Errorf("--window %s: want at least 100ms", window)
			}
			ctx := cmd.Context()
			a, err := openAgent(ctx, loc.agentConfig("bench"))
			if err != nil {
				return err
			}
			defer a.Close()
			res, err := bench.DensityBench(ctx, a, bench.DensityOptions{
				Template: shape.tmpl, MemoryMiB: shape.mem, VCPUs: shape.vcpus, N: n, Parallel: parallel, ReserveMiB: reserve,
				Settle: settle, Window: window, Sample: sample, Rounds: rounds, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "template %s, %d MiB, %s, %d host CPUs\n", res.Template, res.MemoryMiB, res.Accel, res.CPUs)
			fmt.Fprintf(out, "idle sandboxes:        %d of %d asked, started in %.1f s\n", res.Sandboxes, res.Asked, res.CreateSeconds)
			if res.StoppedEarly != "" {
				fmt.Fprintf(out, "stopped early:         %s\n", res.StoppedEarly)
			}
			fmt.Fprintf(out, "PSS per sandbox:       %.1f MiB (private %.1f MiB)\n", res.PSSMiBPerSandbox, res.PrivateMiBPerSandbox)
			fmt.Fprintf(out, "MemAvailable drop:     %.1f MiB per sandbox\n", res.MemAvailableDropMiBPerSandbox)
			fmt.Fprintf(out, "host CPU:              %.1f %% of a core idle baseline, %.1f %% with all idle\n", res.HostCPUPctBaseline, res.HostCPUPctIdle)
			fmt.Fprintf(out, "CPU per idle sandbox:  %.3f %% of a core (host-wide); its VMM process alone %.3f %%; host agent %.1f %% for all\n",
				res.CPUPctOfCorePerSandbox, res.VMMCPUPctOfCorePerSandbox, res.AgentCPUPctOfCore)
			fmt.Fprintf(out, "exec true among them:  p50 %.1f ms  %s %.1f ms  (n=%d)\n", res.Exec.P50, res.Exec.TailName(), res.Exec.P99, res.Exec.N)
			return nil
		},
	}
	f := cmd.Flags()
	loc.register(f)
	shape.register(f)
	f.IntVar(&n, "n", 500, "idle sandboxes to start")
	f.IntVar(&parallel, "parallel", 2, "creates at once")
	f.IntVar(&reserve, "reserve-mib", 2048, "stop creating when the host's MemAvailable falls below this (MiB)")
	f.DurationVar(&settle, "settle", 15*time.Second, "idle time before measuring")
	f.DurationVar(&window, "window", 20*time.Second, "CPU measurement window (baseline and all idle)")
	f.IntVar(&sample, "sample", 100, "sandboxes whose exec round trip is measured")
	f.IntVar(&rounds, "rounds", 2, "exec round trips per sampled sandbox")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
