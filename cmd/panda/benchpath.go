package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/spf13/cobra"
)

func benchPathCmd() *cobra.Command {
	var (
		loc      localBench
		shape    benchShape
		n, execs int
		asJSON   bool
		cpuProf  string
		pySDK    string
		noPython bool
	)
	cmd := &cobra.Command{
		Use:   "path",
		Short: "The API path against the host path in one run: create → first exec and exec round trips",
		Long: `Runs a private server (its own data directory, DATA_DIR/bench: a host agent
with the REST API over it, in this process) and measures, alternating the
two paths round by round so that the machine's noise falls on both alike:

  - create → first exec of true: the host agent called directly (the host
    path) against the REST API through the Go SDK (the API path);
  - exec round trips of true in one sandbox, both ways;
  - with python3 and the Python SDK's sources (sdk/python/src, found in the
    working directory or next to the binary's bin/, or --python-sdk), the
    same through the Python SDK, as a third path: a python3 process that
    times each create → first exec and exec itself.

It prints the distributions and each API path's p50 over the host path's.
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
			sdkDir := ""
			if !noPython {
				var err error
				if sdkDir, err = bench.FindPythonSDK(pySDK); err != nil {
					return err
				}
				if sdkDir == "" {
					fmt.Fprintln(cmd.ErrOrStderr(), "no Python SDK leg: python3 or sdk/python/src not found (--python-sdk DIR)")
				}
			}
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
			o := bench.PathOptions{Template: shape.tmpl, MemoryMiB: shape.mem, VCPUs: shape.vcpus, N: n, Execs: execs, Log: cmd.ErrOrStderr()}
			if sdkDir != "" {
				o.Python = &bench.PythonSDK{SDKDir: sdkDir, APIURL: st.url, APIKey: st.key}
			}
			res, err := bench.PathBench(ctx, st.agent, st.client, o)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "template %s, %d MiB, %s\n", res.Template, res.MemoryMiB, res.Accel)
			rows := []struct {
				name string
				d    *bench.Dist
			}{{"host path: create → first exec", &res.HostCreate}, {"API path:  create → first exec", &res.APICreate},
				{"Python SDK: create → first exec", res.PythonCreate},
				{"host path: exec round trip", &res.HostExec}, {"API path:  exec round trip", &res.APIExec},
				{"Python SDK: exec round trip", res.PythonExec}}
			for _, r := range rows {
				if r.d != nil {
					fmt.Fprintf(out, "%-32s p50 %7.1f ms  %s %7.1f ms  (n %d)\n", r.name, r.d.P50, r.d.TailName(), r.d.P99, r.d.N)
				}
			}
			fmt.Fprintf(out, "API (Go SDK) over host, p50: create %.2f×, exec %.2f×\n", res.APIOverCreate, res.APIOverExec)
			if res.PythonCreate != nil {
				fmt.Fprintf(out, "Python SDK over host, p50: create %.2f×, exec %.2f×\n", res.PythonOverCreate, res.PythonOverExec)
			}
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
	f.StringVar(&pySDK, "python-sdk", "", "the Python SDK's package directory for the Python path (default: sdk/python/src, if found)")
	f.BoolVar(&noPython, "no-python", false, "leave the Python SDK's path out")
	return cmd
}
