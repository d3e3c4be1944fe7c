// Command panda is PandaStack's single binary: the all-in-one server
// (`panda up`), its parts run separately, the CLI verbs users run against
// the API, and benchmarks.
package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/pandastack/pandastack/cmd/panda/internal/cli"
	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/spf13/cobra"
)

func main() {
	// Started as the holder process of lazy restore's mount
	// (lazymem.Config.Holder): serve it and exit.
	lazymem.HolderMain()
	// Tests stop processes at named points of critical sequences to test
	// crash recovery there (package failpoint); never set otherwise.
	if spec := os.Getenv("PANDA_FAILPOINTS"); spec != "" {
		if err := failpoint.Enable(spec); err != nil {
			fmt.Fprintln(os.Stderr, "panda:", err)
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// panda exec exits with the command's status, silently.
		var ee cli.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.Code)
		}
		fmt.Fprintln(os.Stderr, "panda:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := &cobra.Command{
		Use:           "panda",
		Short:         "PandaStack: microVM sandboxes for AI agents",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
	}
	// --version as well as `panda version`: cobra's own flag would print
	// only a fixed string, not the guest agent's version.
	showVersion := root.Flags().Bool("version", false, "print the versions of panda, Go and the guest agent")
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if *showVersion {
			writeVersion(cmd.Context(), cmd.OutOrStdout(), guestAgentPaths())
			return nil
		}
		return cmd.Help()
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.AddCommand(upCmd(), serverCmd(), agentCmd(), benchCmd(), chaosCmd(), rootfsCmd(), versionCmd(), devCmd())
	root.AddCommand(cli.Commands()...)
	return root.ExecuteContext(ctx)
}

// envOr returns the environment variable k, or def.
func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
