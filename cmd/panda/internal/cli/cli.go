// Package cli owns the user-facing verbs of the panda command (create, ls,
// exec, run, network, fs, port, template, keys, ...). They are built only on the
// Go SDK (sdk/go), so the CLI uses the API exactly as users' programs do.
//
// Every verb prints a human table by default and the API's JSON with
// --json, and takes --api-url and --api-key (defaults: PANDASTACK_API_URL,
// PANDASTACK_API_KEY, then the admin key file of a local server).
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

// ExitError is returned (as a value) by a verb that must exit with a
// given status without printing a message, like `panda exec` exiting with
// the command's exit code. main turns it into os.Exit(Code).
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode returns the status to exit with.
func (e ExitError) ExitCode() int { return e.Code }

// DefaultDataDir is where `panda up` keeps its data (and admin.key) unless
// told otherwise.
const DefaultDataDir = "/var/lib/pandastack"

// globals are the flags every verb has.
type globals struct {
	apiURL  string
	apiKey  string
	json    bool
	keyFrom string // where the API key came from, for error hints
}

// Commands returns the CLI verbs, to be added to the root command.
func Commands() []*cobra.Command {
	g := &globals{}
	cmds := []*cobra.Command{
		createCmd(g), lsCmd(g), getCmd(g), execCmd(g), runCmd(g), killCmd(g), ttlCmd(g),
		pauseCmd(g), resumeCmd(g), forkCmd(g), snapshotCmd(g),
		networkCmd(g), fsCmd(g), portCmd(g), procCmd(g), shellCmd(g), templateCmd(g), keysCmd(g), hostsCmd(g),
		eventsCmd(g), volumeCmd(g),
	}
	for _, c := range cmds {
		pf := c.PersistentFlags()
		pf.StringVar(&g.apiURL, "api-url", "", "API URL (default $PANDASTACK_API_URL or "+pandastack.DefaultAPIURL+")")
		pf.StringVar(&g.apiKey, "api-key", "", "API key (default $PANDASTACK_API_KEY, else the local server's admin key file)")
		pf.BoolVar(&g.json, "json", false, "print JSON (the API's objects) instead of tables")
		c.SetFlagErrorFunc(flagError)
		wrapRunE(c, g)
	}
	return cmds
}

// flagError adds a hint to an unknown flag, which is often an argument
// that starts with "-" (a negative number, a remote path, a command's own
// flag): after "--" nothing is taken for a flag.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	var arg string
	switch {
	case strings.HasPrefix(msg, "unknown shorthand flag: "):
		_, arg, _ = strings.Cut(msg, " in ")
	case strings.HasPrefix(msg, "unknown flag: "):
		arg = strings.TrimPrefix(msg, "unknown flag: ")
	default:
		return err
	}
	var operands []string
	for _, w := range strings.Fields(cmd.Use)[1:] {
		if w != "[flags]" && w != "--" && !strings.HasPrefix(w, "[-") {
			operands = append(operands, w)
		}
	}
	return fmt.Errorf("%w\nif %s is an argument, not a flag of %s, put it after --: %s [flags] -- %s",
		err, arg, cmd.CommandPath(), cmd.CommandPath(), strings.Join(operands, " "))
}

// wrapRunE adds hints to the errors of c and its subcommands.
func wrapRunE(c *cobra.Command, g *globals) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			return g.explain(run(cmd, args))
		}
	}
	for _, sub := range c.Commands() {
		wrapRunE(sub, g)
	}
}

// group makes a command that only holds subcommands: alone it prints its
// help, with an unknown subcommand it fails (cobra would print help and
// exit 0).
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(args) > 0 {
			return fmt.Errorf("unknown command %q for %q\nrun '%s --help' for the commands", args[0], cmd.CommandPath(), cmd.CommandPath())
		}
		return cmd.Help()
	}
	return cmd
}

// explain adds what the user can do about an error, where we know it.
func (g *globals) explain(err error) error {
	if err == nil {
		return nil
	}
	var ee ExitError
	if errors.As(err, &ee) {
		return err
	}
	if errors.Is(err, pandastack.ErrUnauthorized) {
		switch g.keyFrom {
		case "":
			return fmt.Errorf("%w\nno API key is set: use --api-key or PANDASTACK_API_KEY (on the server's machine the admin key is in %s)", err, adminKeyPath())
		case "file":
			return fmt.Errorf("%w\nthe admin key was read from %s; is it the key of the server at %s?", err, adminKeyPath(), g.url())
		}
	}
	return err
}

func (g *globals) url() string {
	if g.apiURL != "" {
		return g.apiURL
	}
	if u := os.Getenv("PANDASTACK_API_URL"); u != "" {
		return u
	}
	return pandastack.DefaultAPIURL
}

// adminKeyPath is the admin key file of a server on this machine.
func adminKeyPath() string {
	dir := os.Getenv("PANDA_DATA_DIR")
	if dir == "" {
		dir = DefaultDataDir
	}
	return filepath.Join(dir, "admin.key")
}

// client returns an SDK client for the global flags. With no key given
// anywhere it falls back to the admin key of a local server, so that the
// CLI works on the server's machine right after `make up`.
func (g *globals) client() (*pandastack.Client, error) {
	return pandastack.NewClient(pandastack.Options{APIURL: g.url(), APIKey: g.key(), UserAgent: "panda-cli"})
}

// key returns the API key of the global flags, the environment or the
// local server's admin key file (and notes where it came from).
func (g *globals) key() string {
	key := g.apiKey
	switch {
	case key != "":
		g.keyFrom = "flag"
	case os.Getenv("PANDASTACK_API_KEY") != "":
		key = os.Getenv("PANDASTACK_API_KEY")
		g.keyFrom = "env"
	default:
		if b, err := os.ReadFile(adminKeyPath()); err == nil {
			if k := strings.TrimSpace(string(b)); k != "" {
				key = k
				g.keyFrom = "file"
			}
		}
	}
	return key
}

// sandbox returns a handle on the sandbox id (no request is made).
func (g *globals) sandbox(id string) (*pandastack.Sandbox, error) {
	c, err := g.client()
	if err != nil {
		return nil, err
	}
	return c.Sandbox(id), nil
}

// printJSON prints v indented.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// table is a tabwriter with a header line.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cols ...string) { fmt.Fprintln(t.tw, strings.Join(cols, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// args checks the number of positional arguments, with the usage line in
// the error.
func args(lo, hi int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) >= lo && (hi < 0 || len(args) <= hi) {
			return nil
		}
		return fmt.Errorf("wrong number of arguments\nusage: %s", cmd.UseLine())
	}
}

// pairs parses k=v flags.
func pairs(flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(vals))
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flag, v)
		}
		m[k] = val
	}
	return m, nil
}

// when formats t relative to now: "3m ago", "in 4m59s", "-" for zero.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := time.Until(t)
	if d >= 0 {
		return "in " + short(d)
	}
	return short(-d) + " ago"
}

// short formats d with at most two units.
func short(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// orDash returns s, or "-" if it is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// mib formats a MiB amount, "-" for zero (the server's default).
func mib(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%d MiB", n)
}

// num formats n, "-" for zero.
func num(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}
