package cli

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

// procCmd is the background processes' group: panda proc ls|logs|stdin|signal|wait|kill.
func procCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "proc",
		Short: "Background processes of a sandbox (start one with panda exec --background)",
	})
	cmd.AddCommand(procLsCmd(g), procLogsCmd(g), procStdinCmd(g), procSignalCmd(g), procWaitCmd(g), procKillCmd(g))
	return cmd
}

// process parses ID PID.
func (g *globals) process(args []string) (*pandastack.Process, error) {
	pid, err := strconv.Atoi(args[1])
	if err != nil || pid <= 0 {
		return nil, fmt.Errorf("pid %q: want a positive number", args[1])
	}
	sb, err := g.sandbox(args[0])
	if err != nil {
		return nil, err
	}
	return sb.ProcessHandle(pid), nil
}

func procLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls ID",
		Aliases: []string{"ps"},
		Short:   "List a sandbox's background processes, running and exited",
		Args:    args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			ps, err := sb.Processes(cmd.Context())
			if err != nil {
				return fmt.Errorf("list processes of %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), ps)
			}
			t := newTable(cmd.OutOrStdout(), "PID", "STATE", "EXIT", "STARTED", "CMD")
			for _, p := range ps {
				exit := "-"
				if p.ExitCode != nil {
					exit = strconv.Itoa(*p.ExitCode)
					if p.Signal != "" {
						exit += " (" + p.Signal + ")"
					}
				}
				t.row(strconv.Itoa(p.PID), p.State, exit, p.StartedAt.Local().Format(time.DateTime), p.Cmd)
			}
			return t.flush()
		},
	}
}

var errCaughtUp = errors.New("caught up")

func procLogsCmd(g *globals) *cobra.Command {
	var follow bool
	cmd := &cobra.Command{
		Use:   "logs ID PID",
		Short: "Print a background process's output kept so far (the last 1 MiB of each stream)",
		Long: `Print a background process's stdout and stderr kept so far. With --follow,
go on printing as it comes until the process exits (Ctrl-C stops following;
the process runs on).`,
		Args: args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.process(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			var info pandastack.ProcessInfo
			if !follow {
				if info, err = p.Describe(ctx); err != nil {
					return fmt.Errorf("process %s in %s: %w", args[1], args[0], err)
				}
				if info.StdoutBytes == info.StdoutDropped && info.StderrBytes == info.StderrDropped && info.State == "running" {
					return nil // nothing kept
				}
			}
			var outEnd, errEnd int64
			out, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			_, err = p.Output(ctx, pandastack.FromStart, func(c pandastack.OutputChunk) error {
				w, end := out, &outEnd
				if c.Stderr {
					w, end = stderr, &errEnd
				}
				if c.Dropped > 0 {
					fmt.Fprintf(stderr, "panda: %d earlier bytes of %s are no longer kept\n", c.Dropped, map[bool]string{false: "stdout", true: "stderr"}[c.Stderr])
				}
				if _, err := io.WriteString(w, c.Data); err != nil {
					return err
				}
				*end = c.Offset + int64(len(c.Data))
				if !follow && info.State == "running" && outEnd >= info.StdoutBytes && errEnd >= info.StderrBytes {
					return errCaughtUp
				}
				return nil
			})
			if err != nil && !errors.Is(err, errCaughtUp) {
				return fmt.Errorf("output of process %s in %s: %w", args[1], args[0], err)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "follow the output until the process exits")
	return cmd
}

func procStdinCmd(g *globals) *cobra.Command {
	var closeIt bool
	cmd := &cobra.Command{
		Use:   "stdin ID PID",
		Short: "Send panda's standard input to a background process's stdin (started with --stdin)",
		Args:  args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.process(args)
			if err != nil {
				return err
			}
			b, err := io.ReadAll(cmd.InOrStdin())
			if err != nil {
				return fmt.Errorf("read standard input: %w", err)
			}
			if len(b) > 0 && closeIt {
				// One request: the process may exit as soon as it has read b.
				if err := p.WriteAndCloseStdin(cmd.Context(), b); err != nil {
					return fmt.Errorf("stdin of process %s in %s: %w", args[1], args[0], err)
				}
				return nil
			}
			if len(b) > 0 {
				if err := p.WriteStdin(cmd.Context(), b); err != nil {
					return fmt.Errorf("stdin of process %s in %s: %w", args[1], args[0], err)
				}
			}
			if closeIt {
				if err := p.CloseStdin(cmd.Context()); err != nil {
					return fmt.Errorf("close stdin of process %s in %s: %w", args[1], args[0], err)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&closeIt, "close", false, "close the process's stdin afterwards")
	return cmd
}

func procSignalCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "signal ID PID SIGNAL",
		Short:   "Send a signal (TERM, KILL, INT, HUP, ... or a number) to a background process's group",
		Example: "  panda proc signal $ID 42 TERM",
		Args:    args(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.process(args)
			if err != nil {
				return err
			}
			if err := p.Signal(cmd.Context(), args[2]); err != nil {
				return fmt.Errorf("signal process %s in %s: %w", args[1], args[0], err)
			}
			return nil
		},
	}
}

func procWaitCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "wait ID PID",
		Short: "Wait for a background process to exit; exits with its exit code",
		Args:  args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.process(args)
			if err != nil {
				return err
			}
			info, err := p.Wait(cmd.Context())
			if err != nil {
				return fmt.Errorf("wait for process %s in %s: %w", args[1], args[0], err)
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), info); err != nil {
					return err
				}
			}
			if info.ExitCode != nil && *info.ExitCode != 0 {
				return ExitError{Code: *info.ExitCode}
			}
			return nil
		},
	}
}

func procKillCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "kill ID PID",
		Aliases: []string{"rm"},
		Short:   "Kill a background process's group if it runs, and forget it and its output",
		Args:    args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.process(args)
			if err != nil {
				return err
			}
			if err := p.Kill(cmd.Context()); err != nil {
				return fmt.Errorf("kill process %s in %s: %w", args[1], args[0], err)
			}
			return nil
		},
	}
}
