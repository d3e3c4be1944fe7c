package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/pandastack/pandastack/internal/bench"
	"github.com/spf13/cobra"
)

func benchPathCmd() *cobra.Command {
	var (
		loc      localBench
		shape    benchShape
		n, execs int
		asJSON   bool
		cpuProf  string
	)
	cmd := &cobra.Command{
		Use:   "path",
		Short: "The API path against the host path in one run: create → first exec and exec round trips",
		Long: `Runs a private server (its own data directory, DATA_DIR/bench: a host agent
with the REST API over it, in this process) and measures, alternating the
two paths round by round so that the machine's noise falls on both alike:

  - create → first exec of true: the host agent called directly (the host
    path) against the REST API through the Go SDK (the API path);
  - exec round trips of true in one sandbox, both ways.

It prints both distributions and the API path's p50 over the host path's.
--cpuprofile writes a CPU profile of the whole run (the server's handlers
included: they run in this process).`,
		Example: `  panda bench path --n 40 --execs 200
  panda bench path --template tiny --memory 256 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || execs < 1 {
				return fmt.Errorf("--n and --execs must be at least 1")
			}
			ctx := cmd.Context()
			st, err := startLocalStack(ctx, loc.agentConfig("bench"))
			if err != nil {
				return err
			}
			defer st.close()
			if cpuProf != "" {
				f, err := os.Create(cpuProf)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			res, err := bench.PathBench(ctx, st.agent, st.client, bench.PathOptions{Template: shape.tmpl, MemoryMiB: shape.mem,
				VCPUs: shape.vcpus, N: n, Execs: execs, Log: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "template %s, %d MiB, %s\n", res.Template, res.MemoryMiB, res.Accel)
			for _, r := range []struct {
				name string
				d    bench.Dist
			}{{"host path: create → first exec", res.HostCreate}, {"API path:  create → first exec", res.APICreate},
				{"host path: exec round trip", res.HostExec}, {"API path:  exec round trip", res.APIExec}} {
				fmt.Fprintf(out, "%-32s p50 %7.1f ms  p99 %7.1f ms  (n %d)\n", r.name, r.d.P50, r.d.P99, r.d.N)
			}
			fmt.Fprintf(out, "API over host, p50: create %.2f×, exec %.2f×\n", res.APIOverCreate, res.APIOverExec)
			return nil
		},
	}
	f := cmd.Flags()
	loc.register(f)
	shape.register(f)
	f.IntVar(&n, "n", 40, "creates on each path")
	f.IntVar(&execs, "execs", 200, "exec round trips on each path")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.StringVar(&cpuProf, "cpuprofile", "", "write a CPU profile of the run to this file")
	return cmd
}
