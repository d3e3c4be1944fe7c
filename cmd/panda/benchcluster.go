package main

import (
	"encoding/json"
	"fmt"

	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/spf13/cobra"
)

func benchClusterCmd() *cobra.Command {
	var (
		rem           remoteBench
		tmpl          string
		n, mem, dirty int
		lazyDirty     int
		env           int
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Same-host vs cross-host fork, bytes moved, resume on another host: through the REST API of a fleet",
		Long: `Measure a fleet (panda server --fleet with at least two hosts sharing an
object store, e.g. panda dev cluster) through its REST API. Each of --n
rounds creates a parent on the first ready host, writes --dirty MiB of
random data to its memory (/dev/shm), then:

  - forks it to its own host → the child's first exec answered
  - forks it to the second host → the child's first exec answered, and
    the bytes that moved (the parent's host's upload to the object store
    plus the other host's fetch) against its dirty memory and RAM
  - pauses it and resumes it on the second host, which never saw it →
    first exec answered

With --env MiB the parents are created from a snapshot (an environment of
that many MiB of random data, half on its disk, half in its memory) that
both hosts hold, not from the template: a cross-host fork then moves what
the parent dirtied since the snapshot, not the snapshot's data again.

Then --n rounds of lazy restore (unless --lazy-dirty 0): a parent that
writes --lazy-dirty MiB is paused and resumed on the second host → first
exec answered, and the fraction of its memory image that host had fetched
from the object store by then. The hosts must run with --lazy-restore
(panda dev cluster --lazy-restore); otherwise the output says so.

Every sandbox it creates is labelled panda_bench=<run> and killed before
it exits.`,
		Example: `  panda bench cluster --n 10 --dirty 16 --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return fmt.Errorf("--n %d: want at least 1", n)
			}
			if env < 0 {
				return fmt.Errorf("--env %d: want 0 (parents from the template) or more MiB", env)
			}
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			res, err := bench.ClusterBench(cmd.Context(), c, bench.ClusterOptions{Template: tmpl, MemoryMiB: mem, DirtyMiB: dirty, N: n,
				LazyDirtyMiB: lazyDirty, EnvMiB: env, Log: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if rem.asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Fprintf(out, "hosts %v, template %s, %d MiB, %d MiB dirty, %d rounds\n", res.Hosts, res.Template, res.MemoryMiB, res.DirtyMiB, res.SameHostForkFirstExec.N)
			if res.EnvSnapshot != "" {
				fmt.Fprintf(out, "parents created from snapshot %s (%d MiB environment), which both hosts hold\n", res.EnvSnapshot, res.EnvMiB)
			}
			for _, r := range []struct {
				name string
				d    bench.Dist
			}{{"same-host fork → child exec", res.SameHostForkFirstExec}, {"  of which the fork's answer", res.SameHostForkAnswer},
				{"cross-host fork → child exec", res.CrossHostForkFirstExec}, {"  of which the fork's answer", res.CrossHostForkAnswer},
				{"resume on another host → exec", res.ResumeElsewhereFirstExec}} {
				fmt.Fprintf(out, "%-32s p50 %7.1f ms  %s %7.1f ms\n", r.name, r.d.P50, r.d.TailName(), r.d.P99)
			}
			fmt.Fprintf(out, "cross-host fork moved p50 %.1f MiB (direct %.1f, pulled host to host %.1f, + uploaded %.1f + fetched %.1f; parent dirty %.1f MiB: %.2f×; %.2f of its RAM; capture %.1f MiB)\n",
				res.CrossHostMovedMiBP50, res.CrossHostDirectMiBP50, res.CrossHostPulledMiBP50, res.CrossHostUploadedMiBP50, res.CrossHostFetchedMiBP50, res.CrossHostDirtyMiBP50,
				res.MovedPerDirty, res.MovedPerRAM, res.CrossHostCaptureMiBP50)
			if d := res.LazyResumeFirstExec; d != nil {
				fmt.Fprintf(out, "%-32s p50 %7.1f ms  %s %7.1f ms  (%d MiB dirty; fetched by then p50 %.1f MiB of %.0f: %.1f %%)\n", "lazy resume elsewhere → exec",
					d.P50, d.TailName(), d.P99, res.LazyDirtyMiB, res.LazyFetchedMiBP50, res.LazyImageMiB, 100*res.LazyFetchedFractionP50)
			}
			if res.LazyNote != "" {
				fmt.Fprintf(out, "lazy restore: not measured: %s\n", res.LazyNote)
			}
			return nil
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "base", "template")
	f.IntVar(&mem, "memory", 1024, "guest memory in MiB")
	f.IntVar(&dirty, "dirty", 16, "MiB each parent writes to memory before it is forked")
	f.IntVar(&n, "n", 10, "rounds")
	f.IntVar(&env, "env", 0, "MiB of an environment snapshot both hosts hold that the parents are created from (0: from the template)")
	f.IntVar(&lazyDirty, "lazy-dirty", 96, "MiB each lazy-restore round's parent writes to memory (0: no lazy-restore rounds)")
	return cmd
}
