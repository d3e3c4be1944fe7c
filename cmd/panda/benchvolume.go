package main

import (
	"fmt"
	"io"

	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/spf13/cobra"
)

func benchVolumeCmd() *cobra.Command {
	var (
		rem                                               remoteBench
		tmpl                                              string
		mem, fileMiB, runs, files, n, forkCount, forkRuns int
	)
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Volumes next to the sandbox's own disk: throughput, metadata, create and fork latency, branch forks, through the REST API of a running server",
		Long: `Measure a running server's volumes through its REST API (the Go SDK), each
figure next to its yardstick, measured in the same run:

  - sequential write (with fsync) and read (after dropping the guest's page
    cache) of a --file-mib file in a volume and on the root disk, --runs
    times, timed inside the guest
  - create, stat and remove of --files small files, in both places
  - create → first exec with a volume mounted and without (--n of each)
  - fork → the child's first exec, of a parent with a volume and without
  - a fork of --fork-count children with volume_mode branch and with share
    (--fork-runs of each; the volume holds 200 files of 16 KiB)

It creates the volume bench-<run id> and deletes it, with the branches its
forks make, before it exits; every sandbox it creates is labelled
panda_bench=<run id> and killed, also on errors and Ctrl-C.`,
		Example: `  panda bench volume
  panda bench volume --file-mib 64 --files 2000 --n 5 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if fileMiB < 1 || runs < 1 || files < 1 || n < 1 || forkCount < 1 || forkRuns < 1 {
				return fmt.Errorf("--file-mib, --runs, --files, --n, --fork-count and --fork-runs must be at least 1")
			}
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			res, err := bench.VolumeBench(cmd.Context(), c, bench.VolumeOptions{
				Template: tmpl, MemoryMiB: mem, FileMiB: fileMiB, Runs: runs, Files: files, N: n,
				ForkCount: forkCount, ForkRuns: forkRuns, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if rem.asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			printVolumeResult(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "", "template of every sandbox (default: the server's)")
	f.IntVar(&mem, "memory", 0, "guest memory in MiB (default: the server's)")
	f.IntVar(&fileMiB, "file-mib", 256, "size of the sequentially written and read file, MiB")
	f.IntVar(&runs, "runs", 3, "sequential write/read measurements, in each place")
	f.IntVar(&files, "files", 10000, "small files created, stat'ed and removed, in each place")
	f.IntVar(&n, "n", 10, "creates and forks measured, with a volume and without")
	f.IntVar(&forkCount, "fork-count", 8, "children of each branch and share fork")
	f.IntVar(&forkRuns, "fork-runs", 3, "branch and share forks measured, of each")
	return cmd
}

func printVolumeResult(out io.Writer, r bench.VolumeResult) {
	fmt.Fprintf(out, "server %s, template %s, %d MiB\n", r.APIURL, r.Template, r.MemoryMiB)
	tp := func(what string, v, root bench.Throughput, ratio float64) {
		fmt.Fprintf(out, "%-26s volume p50 %7.1f MB/s (min %.1f)  root disk p50 %7.1f MB/s (min %.1f)  ratio %.2f  (n=%d)\n",
			what+":", v.P50, v.Min, root.P50, root.Min, ratio, v.N)
	}
	tp(fmt.Sprintf("write %d MiB + fsync", r.FileMiB), r.VolumeWrite, r.RootfsWrite, r.WriteRatioP50)
	tp(fmt.Sprintf("read %d MiB, cold", r.FileMiB), r.VolumeRead, r.RootfsRead, r.ReadRatioP50)
	fmt.Fprintf(out, "%-26s volume %9.1f ops/s  root disk %9.1f ops/s  ratio %.2f\n",
		fmt.Sprintf("create+stat+rm ×%d:", r.Files), r.VolumeMetaOpsSec, r.RootfsMetaOpsSec, r.MetaRatio)
	line := func(what string, a, b bench.Dist, ratio float64) {
		fmt.Fprintf(out, "%-26s p50 %7.1f ms  %s %7.1f ms   without: p50 %7.1f ms  %s %7.1f ms  ratio %.2f  (n=%d)\n",
			what+":", a.P50, a.TailName(), a.P99, b.P50, b.TailName(), b.P99, ratio, a.N)
	}
	line("create → first exec", r.CreateWithVolume, r.CreatePlain, r.CreateRatioP50)
	line("fork → child exec", r.ForkWithVolume, r.ForkPlain, r.ForkRatioP50)
	fmt.Fprintf(out, "%-26s branch p50 %7.1f ms  %s %7.1f ms   share: p50 %7.1f ms  %s %7.1f ms  ratio %.2f  (n=%d, %d files)\n",
		fmt.Sprintf("fork ×%d:", r.ForkCount), r.ForkBranch.P50, r.ForkBranch.TailName(), r.ForkBranch.P99,
		r.ForkShare.P50, r.ForkShare.TailName(), r.ForkShare.P99, r.BranchRatioP50, r.ForkBranch.N, r.BranchFilesHeld)
}
