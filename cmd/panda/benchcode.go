package main

import (
	"fmt"
	"io"

	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/spf13/cobra"
)

func benchCodeCmd() *cobra.Command {
	var (
		rem                              remoteBench
		tmpl, base                       string
		mem, n, runs, charts, forks, imp int
	)
	cmd := &cobra.Command{
		Use:   "code",
		Short: "The code interpreter next to exec: first cell, round trip, charts, forks, warm imports, through the REST API of a running server",
		Long: `Measure a running server's code interpreter through its REST API (the Go
SDK), each figure next to the exec path it is compared with, in the same run:

  - create → first run_code("1+1") on --template, and create → first exec
    of true on --base (sequential, --n of each, interleaved)
  - run_code("1+1") and exec of true round trips in one warm sandbox (--runs)
  - a matplotlib line chart to its PNG (--charts)
  - fork of a sandbox whose kernel holds a DataFrame → the child's first
    cell reading it, and fork → the child's first exec (--forks of each)
  - import pandas in the baked warm context and in fresh contexts (--imports)

Every sandbox it creates is labelled panda_bench=<run id> and killed before
it exits, also on errors and Ctrl-C. The server needs sandbox networking or
a guest agent that carries port connections (docs/code-interpreter.md).`,
		Example: `  panda bench code --n 10 --runs 50
  panda bench code --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 || runs < 1 || charts < 1 || forks < 1 || imp < 1 {
				return fmt.Errorf("--n, --runs, --charts, --forks and --imports must be at least 1")
			}
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			res, err := bench.CodeBench(cmd.Context(), c, bench.CodeOptions{
				Template: tmpl, BaseTemplate: base, MemoryMiB: mem, N: n, Runs: runs, Charts: charts,
				Forks: forks, Imports: imp, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if rem.asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			printCodeResult(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "code-interpreter", "the code interpreter's template")
	f.StringVar(&base, "base", "base", "the template whose create → first exec is the yardstick")
	f.IntVar(&mem, "memory", 1024, "guest memory in MiB, of every sandbox")
	f.IntVar(&n, "n", 10, "sequential creates to measure, of each template")
	f.IntVar(&runs, "runs", 50, "round trips of run_code(1+1) and of exec true")
	f.IntVar(&charts, "charts", 10, "matplotlib charts to draw")
	f.IntVar(&forks, "forks", 5, "forks to measure, of each kind")
	f.IntVar(&imp, "imports", 5, "imports of pandas, warm and fresh")
	return cmd
}

func printCodeResult(out io.Writer, res bench.CodeResult) {
	fmt.Fprintf(out, "server %s, templates %s and %s, %d MiB\n", res.APIURL, res.Template, res.BaseTemplate, res.MemoryMiB)
	line := func(what string, d bench.Dist) {
		fmt.Fprintf(out, "%-34s p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", what+":", d.P50, d.TailName(), d.P99, d.N)
	}
	line("create → first run_code(1+1)", res.CreateToFirstCode)
	line("create → first exec ("+res.BaseTemplate+")", res.CreateToFirstExec)
	fmt.Fprintf(out, "  ratio of p50s: %.2f\n", res.CreateRatioP50)
	line("run_code(1+1) round trip", res.RunCode)
	line("exec true round trip", res.Exec)
	fmt.Fprintf(out, "  ratio of p50s: %.2f\n", res.RunCodeRatioP50)
	line("matplotlib chart → PNG", res.Chart)
	line("fork → child's first run_code", res.ForkToChildCode)
	line("fork → child's first exec", res.ForkToChildExec)
	fmt.Fprintf(out, "  ratio of p50s: %.2f\n", res.ForkRatioP50)
	line("import pandas, warm context", res.ImportPandasWarm)
	line("import pandas, fresh context", res.ImportPandasFresh)
	line("create a context", res.CreateContext)
}
