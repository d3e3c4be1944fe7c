package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

func fsWatchCmd(g *globals) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "watch ID PATH",
		Short: "Print the changes in a directory as they happen, until interrupted",
		Long: `Watch the directory PATH and print one line per change: TYPE PATH
(rename: rename OLD -> NEW), or the API's JSON lines with --json. TYPE is
create, write, remove, rename, chmod, or overflow (events were lost). Ends on
Ctrl-C, or when the directory is removed.`,
		Example: `  panda fs watch $ID /work -r`,
		Args:    args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			enc := json.NewEncoder(out)
			var werr error
			err = sb.WatchDir(cmd.Context(), args[1], recursive, func(ev pandastack.WatchEvent) {
				if werr != nil {
					return
				}
				switch {
				case g.json:
					werr = enc.Encode(ev)
				case ev.Type == pandastack.WatchRename:
					_, werr = fmt.Fprintf(out, "%s %s -> %s\n", ev.Type, ev.OldPath, ev.Path)
				case ev.Type == pandastack.WatchOverflow:
					_, werr = fmt.Fprintln(out, "overflow (events were lost)")
				default:
					_, werr = fmt.Fprintf(out, "%s %s\n", ev.Type, ev.Path)
				}
			})
			if err != nil {
				return fmt.Errorf("watch %s: %w", args[1], err)
			}
			return werr
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "watch the directories under PATH too (at most 8192)")
	return cmd
}

func eventsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "events",
		Short: "Print the changes of your sandboxes and snapshots as they happen, until interrupted",
		Long: `Follow the key's event stream (GET /v1/events) and print one line per
event: SEQ TYPE ID, then a sandbox's state or a stopped sandbox's reason; or
the API's JSON lines with --json. Ends on Ctrl-C, when the key is revoked or
the server stops, or after "overflow" (the output was read too slowly).`,
		Example: `  panda events
  panda events --json | jq -c 'select(.type == "sandbox") | .sandbox.state'`,
		Args: args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			st, err := c.Events(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			out := cmd.OutOrStdout()
			enc := json.NewEncoder(out)
			for {
				ev, err := st.Next()
				if errors.Is(err, io.EOF) || err != nil && cmd.Context().Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				switch {
				case g.json:
					err = enc.Encode(ev)
				case ev.Sandbox != nil:
					_, err = fmt.Fprintf(out, "%d %s %s %s\n", ev.Seq, ev.Type, ev.ID, ev.Sandbox.State)
				case ev.StopReason != "":
					_, err = fmt.Fprintf(out, "%d %s %s %s\n", ev.Seq, ev.Type, ev.ID, ev.StopReason)
				default:
					_, err = fmt.Fprintf(out, "%d %s %s\n", ev.Seq, ev.Type, ev.ID)
				}
				if err != nil {
					return err
				}
			}
		},
	}
}
