package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

// entriesHelp says what an --allow-out or --deny-out value may be.
const entriesHelp = "an IPv4 address, CIDR, domain (exactly that name) or *.domain (the names below it); repeatable or comma-separated"

// networkFlags are the egress flags of create.
type networkFlags struct {
	noInternet        bool
	allowOut, denyOut []string
}

func (n *networkFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&n.noInternet, "no-internet", false, "deny the internet: the sandbox reaches only what --allow-out allows")
	f.StringSliceVar(&n.allowOut, "allow-out", nil, "allow connections to "+entriesHelp+"; wins over --deny-out")
	f.StringSliceVar(&n.denyOut, "deny-out", nil, "deny connections to "+entriesHelp)
}

// policy is the policy the flags ask for, or nil for the server's default
// (the internet allowed) when none was given.
func (n *networkFlags) policy() *pandastack.Network {
	if !n.noInternet && len(n.allowOut) == 0 && len(n.denyOut) == 0 {
		return nil
	}
	return &pandastack.Network{Internet: !n.noInternet, AllowOut: n.allowOut, DenyOut: n.denyOut}
}

func networkCmd(g *globals) *cobra.Command {
	var (
		internet          bool
		allowOut, denyOut []string
	)
	cmd := &cobra.Command{
		Use:     "network ID",
		Aliases: []string{"net"},
		Short:   "Show or change a sandbox's egress policy (what it may connect to)",
		Long: `Show a sandbox's egress policy, or change it with flags: each flag given
replaces that part of the policy, the others stay. --internet=false denies
everything but --allow-out; --internet=true allows everything but
--deny-out; --allow-out wins over --deny-out. --allow-out '' empties the
list. A running sandbox's rules change at once (established connections
stay up), a paused one's when it resumes. Prints the resulting policy; with
--json, the API's NetworkPolicy object.

The server always blocks the host, other sandboxes, link-local addresses
(cloud metadata) and the host's private networks unless its operator
allowed them. Names are enforced by the sandbox's DNS resolver.`,
		Example: `  panda create --no-internet --allow-out pypi.org --allow-out files.pythonhosted.org
  panda network $ID
  panda network $ID --internet=true --deny-out '*.example.com'
  panda network $ID --allow-out ''`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u pandastack.NetworkUpdate
			f := cmd.Flags()
			if f.Changed("internet") {
				u.Internet = &internet
			}
			if f.Changed("allow-out") {
				u.AllowOut = &allowOut
			}
			if f.Changed("deny-out") {
				u.DenyOut = &denyOut
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var sb *pandastack.Sandbox
			if u == (pandastack.NetworkUpdate{}) {
				if sb, err = c.Get(cmd.Context(), args[0]); err != nil {
					return err
				}
			} else {
				sb = c.Sandbox(args[0])
				if err := sb.SetNetwork(cmd.Context(), u); err != nil {
					return fmt.Errorf("set network of %s: %w", args[0], err)
				}
			}
			return printNetwork(cmd.OutOrStdout(), g, sb.Info.Network)
		},
	}
	f := cmd.Flags()
	// Default false so that help shows no default: not given means unchanged.
	f.BoolVar(&internet, "internet", false, "true: allow the internet but --deny-out; false: deny it but --allow-out")
	f.StringSliceVar(&allowOut, "allow-out", nil, "replace the allow list: "+entriesHelp)
	f.StringSliceVar(&denyOut, "deny-out", nil, "replace the deny list: "+entriesHelp)
	return cmd
}

// printNetwork prints a policy, as JSON or as "field: value" lines.
func printNetwork(w io.Writer, g *globals, n *pandastack.Network) error {
	if n == nil {
		return errors.New("the server reported no network policy (it predates egress policies)")
	}
	if g.json {
		return printJSON(w, n)
	}
	t := newTable(w, "internet:", yesNo(n.Internet))
	t.row("allow_out:", list(n.AllowOut))
	t.row("deny_out:", list(n.DenyOut))
	return t.flush()
}

// networkText is a policy on one line, for panda get.
func networkText(n *pandastack.Network) string {
	if n == nil {
		return "-"
	}
	s := "internet"
	if !n.Internet {
		s = "no internet"
	}
	if len(n.AllowOut) > 0 {
		s += "; allow " + list(n.AllowOut)
	}
	if len(n.DenyOut) > 0 {
		s += "; deny " + list(n.DenyOut)
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// list joins entries with commas, "-" for none.
func list(l []string) string {
	if len(l) == 0 {
		return "-"
	}
	return strings.Join(l, ",")
}
