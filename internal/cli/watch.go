package cli

import (
	"encoding/json"
	"fmt"

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
