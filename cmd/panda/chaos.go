package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/testing/chaos"
	"github.com/spf13/cobra"
)

func chaosCmd() *cobra.Command {
	var (
		cfg    chaos.Config
		asJSON bool
		quiet  bool
	)
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Fault-injection suite: random operations, crashes and restarts, invariants checked after each iteration",
		Long: `Run a real panda up (or, with --split, panda agent and panda server) on a
data directory of its own, loop random operations through the REST API
(create, exec, write a file, fork, snapshot, pause, resume, kill, short TTLs,
create from a snapshot) and at random moments kill the server, the agent or
a sandbox's QEMU with SIGKILL, stop them with SIGTERM, or restart a process
with a failpoint that crashes it inside a pause, resume, snapshot or fork;
restart what died; after every iteration check that the catalog, the QEMU
processes and the files on disk agree, that no sandbox whose data existed is
gone, that nothing is orphaned and that sandboxes hold their files and
processes. At the end kill everything, stop with SIGTERM and check that
nothing is left.

Every random choice comes from --seed (printed): a failing run is replayed
with the same seed (and --split if it had it). It exits non-zero on the
first violation (all of them with --keep-going). See docs/operations.md.

Needs root (the store is a loop-mounted XFS image), QEMU and the guest
images (make setup).`,
		Example: `  panda chaos --iterations 100
  panda chaos --split --iterations 20 --seed 42
  panda chaos --soak 30m --json > soak.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the panda binary: %w", err)
			}
			cfg.Bin = bin
			if !quiet {
				cfg.Log = cmd.ErrOrStderr()
			}
			rep, err := chaos.Run(cmd.Context(), cfg)
			if rep.Seed != 0 && quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "chaos: seed %d\n", rep.Seed)
			}
			if asJSON {
				if jerr := writeJSON(cmd.OutOrStdout(), rep); jerr != nil {
					return jerr
				}
			} else if rep.Seed != 0 {
				rep.WriteText(cmd.OutOrStdout())
			}
			if err != nil && rep.Logs != "" {
				fmt.Fprint(cmd.ErrOrStderr(), rep.Logs)
			}
			if errors.Is(err, chaos.ErrViolation) && len(rep.Violations) > 0 {
				// The report lists them; say it once more, last.
				return fmt.Errorf("%d invariant violations; replay with --seed %d", len(rep.Violations), rep.Seed)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Iterations, "iterations", 100, "iterations to run")
	f.DurationVar(&cfg.Soak, "soak", 0, "run this long instead of --iterations, without server or agent kills, sampling RSS, open files and goroutines (e.g. 30m)")
	f.DurationVar(&cfg.SampleEvery, "sample-every", time.Minute, "soak: how often to sample the processes")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed of every random choice (default: random, printed)")
	f.BoolVar(&cfg.Split, "split", false, "run panda server + panda agent instead of panda up")
	f.BoolVar(&cfg.Network, "network", false, "sandbox networking on, in namespaces the run makes (execs fetch from a test web server)")
	f.StringVar(&cfg.DataDir, "data-dir", "", "data directory, empty or new (default: a new temporary directory, removed at the end)")
	f.StringVar(&cfg.Images, "images", filepath.Join(envOr("PANDA_DATA_DIR", "/var/lib/pandastack"), "images"), "guest images from make setup")
	f.StringVar(&cfg.Accel, "accel", "tcg", "accelerator of the deployment")
	f.StringVar(&cfg.Template, "template", "tiny", "default template of the deployment")
	f.IntVar(&cfg.MemoryMiB, "memory", 256, "default guest memory (MiB) of the deployment")
	f.IntVar(&cfg.MaxLive, "max-live", 8, "most sandboxes alive at once")
	f.Float64Var(&cfg.FaultRate, "fault-rate", 0.35, "probability that an iteration injects a fault")
	f.BoolVar(&cfg.KeepGoing, "keep-going", false, "go on after a violation and report them all")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&quiet, "quiet", false, "no line per iteration on stderr")
	return cmd
}
