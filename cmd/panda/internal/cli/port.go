package cli

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/spf13/cobra"
)

func portCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "port ID PORT",
		Short: "Print a URL that reaches a port of a sandbox without a key (signed, until --ttl)",
		Long: `Print a signed URL of a port of a sandbox: anyone with it reaches the
server listening on that port (on every address, 0.0.0.0 or ::) through the
PandaStack server, without an API key, until it expires, while the sandbox
runs. With --json, the URL and its expiry.

panda port ls ID lists the ports listening in the sandbox.`,
		Example: `  panda exec $ID -- 'cd /work && (setsid python3 -m http.server 8000 >/dev/null 2>&1 &)'
  panda port ls $ID
  panda port $ID 8000 --ttl 10m
  curl "$(panda port $ID 8000)"`,
		Args: args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil || port < 1 || port > 65535 {
				return fmt.Errorf("PORT %q: want a number from 1 to 65535", args[1])
			}
			if ttl < 0 || (ttl > 0 && ttl < time.Second) {
				return fmt.Errorf("--ttl %v: want at least 1s", ttl)
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			u, err := sb.URL(cmd.Context(), port, ttl)
			if err != nil {
				return fmt.Errorf("sign a url of port %d of %s: %w", port, args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), u)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), u.URL)
			return err
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "how long the URL works, e.g. 10m, 2h (default 1h, at most the server's max TTL)")
	cmd.AddCommand(&cobra.Command{
		Use:     "ls ID",
		Aliases: []string{"list"},
		Short:   "List the TCP ports listening in a sandbox",
		Args:    args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			ports, err := sb.Ports(cmd.Context())
			if err != nil {
				return fmt.Errorf("list ports of %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"ports": ports})
			}
			t := newTable(cmd.OutOrStdout(), "PORT", "ADDRESS", "THROUGH THE SERVER")
			for _, p := range ports {
				reach := "yes"
				if a, err := netip.ParseAddr(p.Address); err == nil && a.Unmap().IsLoopback() {
					reach = "no: loopback only"
				}
				t.row(strconv.Itoa(p.Port), p.Address, reach)
			}
			return t.flush()
		},
	})
	return cmd
}
