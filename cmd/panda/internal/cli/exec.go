package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

func execCmd(g *globals) *cobra.Command {
	var (
		env     []string
		cwd     string
		user    string
		timeout float64
		stdin   bool
		bg      bool
		keep    bool
	)
	cmd := &cobra.Command{
		Use:   "exec ID [flags] [--] CMD [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its exit code",
		Long: `Run a command in a sandbox. Its output is streamed as it is produced and
panda exits with the command's exit code.

A single CMD is run as a shell string (bash -c CMD, or /bin/sh -c CMD in a
sandbox without bash); several words are run
directly as a program and its arguments. panda's flags go before the
command: from the command's first word on, everything is the command's
(panda exec ID ls -la), with or without a -- before it.

With --json the output is collected and printed at the end as the API's
ExecResult object (exit_code, stdout, stderr, ...); the exit code is still
the command's.

With --background the command is started as a background process and its
pid printed: it runs on after panda exits, with no timeout unless --timeout
is given; see panda proc for its output, stdin and signals. With -i its
stdin is what panda reads; with --keep-stdin it stays open for panda proc
stdin.`,
		Example: `  panda exec $ID -- 'echo hello && uname -a'
  panda exec $ID ls -la /work
  panda exec $ID --cwd /tmp --env DEBUG=1 -- ls -la
  panda exec $ID --user 1000:1000 -- id
  echo 'print(1+1)' | panda exec $ID -i -- python3
  panda exec $ID --background -- 'python3 -m http.server 8000'`,
		Args: args(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := commandArgs(cmd, args, 1)
			if err != nil || len(args) < 2 {
				return orUsage(cmd, err)
			}
			e, err := pairs("env", env)
			if err != nil {
				return err
			}
			c := pandastack.Command{Env: e, Cwd: cwd, User: user}
			if rest := args[1:]; len(rest) == 1 {
				c.Cmd = rest[0]
			} else {
				c.Argv = rest
			}
			if cmd.Flags().Changed("timeout") {
				switch {
				case timeout < 0:
					return fmt.Errorf("--timeout %v: want 0 (no timeout) or more seconds", timeout)
				case timeout == 0:
					c.Timeout = pandastack.NoTimeout
				default:
					c.Timeout = seconds(timeout)
				}
			}
			if stdin {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("read standard input: %w", err)
				}
				c.Stdin = string(b)
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if bg {
				if !cmd.Flags().Changed("timeout") {
					c.Timeout = 0 // none, for a background process
				}
				c.OpenStdin = keep
				p, err := sb.StartProcess(ctx, c)
				if err != nil {
					return fmt.Errorf("start in %s: %w", args[0], err)
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), p.Info)
				}
				fmt.Fprintln(cmd.OutOrStdout(), p.PID)
				return nil
			}
			var res pandastack.ExecResult
			if g.json {
				res, err = sb.Exec(ctx, c)
			} else {
				res, err = sb.ExecStream(ctx, c, cmd.OutOrStdout(), cmd.ErrOrStderr())
			}
			if err != nil {
				if errors.Is(err, context.Canceled) && ctx.Err() != nil {
					return ExitError{Code: 130} // interrupted: the command was killed
				}
				return fmt.Errorf("exec in %s: %w", args[0], err)
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else if res.TimedOut {
				fmt.Fprintf(cmd.ErrOrStderr(), "panda: the command timed out and was killed (%s)\n", orDash(res.Signal))
			}
			if res.ExitCode != 0 {
				return ExitError{Code: res.ExitCode}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // the command's flags are its own: commandArgs
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory (default the user's home, /root for root)")
	f.StringVarP(&user, "user", "u", "", "run as USER, NAME|UID[:GROUP|GID] as Docker's (default the template image's user, else root)")
	f.Float64Var(&timeout, "timeout", 60, "kill the command after SEC seconds; 0 for no timeout")
	f.BoolVarP(&stdin, "stdin", "i", false, "send panda's standard input to the command (read fully first)")
	f.BoolVarP(&bg, "background", "d", false, "start as a background process, print its pid and return")
	f.BoolVar(&keep, "keep-stdin", false, "with --background: keep the process's stdin open for panda proc stdin")
	return cmd
}

func seconds(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// commandArgs finishes parsing the arguments of a verb that runs a
// command in a sandbox (exec, shell), whose flag set does not intersperse
// (SetInterspersed(false)): as with docker exec, panda's flags go before
// the command — before or after the n arguments of the verb itself (the
// ID) — and from the command's first word on everything is the command's,
// with or without a "--" before it: panda exec ID ls -la runs ls -la.
// args are what cobra left after the flags before the first argument; it
// returns the verb's arguments followed by the command.
func commandArgs(cmd *cobra.Command, args []string, n int) ([]string, error) {
	if len(args) <= n {
		return args, nil
	}
	f := cmd.Flags()
	if err := f.Parse(args[n:]); err != nil {
		return nil, cmd.FlagErrorFunc()(cmd, err)
	}
	if help, _ := f.GetBool("help"); help {
		return nil, errHelp
	}
	return append(args[:n:n], f.Args()...), nil
}

// errHelp: the verb's help was asked for after its arguments.
var errHelp = errors.New("help requested")

// orUsage is err, the help if that was asked for, or else the usage error
// of a command that lacks arguments.
func orUsage(cmd *cobra.Command, err error) error {
	switch {
	case errors.Is(err, errHelp):
		return cmd.Help()
	case err != nil:
		return err
	}
	return fmt.Errorf("wrong number of arguments\nusage: %s", cmd.UseLine())
}
