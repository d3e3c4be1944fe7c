package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

func createCmd(g *globals) *cobra.Command {
	var (
		opts      pandastack.CreateOptions
		meta, env []string
		network   networkFlags
		host      string
		volumes   []string
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox and print its id",
		Example: `  panda create
  panda create --template tiny --memory 256 --ttl 3600 --meta owner=me
  panda create --ttl 600 --on-expire pause
  panda create --no-internet --allow-out pypi.org --allow-out files.pythonhosted.org
  panda create --host h2
  panda create --volume data:/mnt/data --volume refs:/mnt/refs:ro
  ID=$(panda create) && panda exec $ID -- uname -a`,
		Args: args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if opts.Metadata, err = pairs("meta", meta); err != nil {
				return err
			}
			if opts.Env, err = pairs("env", env); err != nil {
				return err
			}
			opts.Network = network.policy()
			if cmd.Flags().Changed("host") {
				if host == "" {
					return errors.New("--host needs a host id (see panda hosts)")
				}
				opts.Placement = pandastack.OnHost(host)
			}
			if opts.OnExpire != "" && opts.OnExpire != "kill" && opts.OnExpire != "pause" {
				return fmt.Errorf("--on-expire must be kill or pause, not %q", opts.OnExpire)
			}
			if opts.Volumes, err = volumeMounts(volumes); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			// What the create does first (fetch or bake its template) goes
			// to stderr: stdout holds the id alone.
			opts.Progress = func(msg string) { fmt.Fprintln(cmd.ErrOrStderr(), msg) }
			sb, err := c.Create(cmd.Context(), opts)
			if err != nil {
				return fmt.Errorf("create sandbox: %w", err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sb.Info)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Template, "template", "", "template (default base)")
	f.IntVar(&opts.TTLSeconds, "ttl", 0, "seconds until the sandbox is killed (default 300)")
	f.IntVar(&opts.MemoryMiB, "memory", 0, "guest memory in MiB (default 1024)")
	f.IntVar(&opts.VCPUs, "vcpus", 0, "guest vCPUs (default 1)")
	f.StringArrayVar(&meta, "meta", nil, "metadata label KEY=VALUE (repeatable)")
	f.StringArrayVar(&env, "env", nil, "default environment variable KEY=VALUE of every command (repeatable)")
	f.StringVar(&opts.SnapshotID, "snapshot", "", "create from this snapshot instead of a template")
	f.StringVar(&opts.OnExpire, "on-expire", "", "what the TTL's end does: kill or pause (default kill)")
	f.StringVar(&host, "host", "", "run on this host (see panda hosts; default: the server chooses)")
	f.StringArrayVar(&volumes, "volume", nil, "mount a volume NAME:/PATH[:ro] (repeatable; see panda volume)")
	network.add(cmd)
	return cmd
}

func lsCmd(g *globals) *cobra.Command {
	var (
		state string
		meta  []string
		quiet bool
	)
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your sandboxes (stopped ones only with --state stopped)",
		Args:    args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, err := pairs("meta", meta)
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sbs, err := c.List(cmd.Context(), pandastack.ListOptions{State: pandastack.SandboxState(state), Metadata: m})
			if err != nil {
				return fmt.Errorf("list sandboxes: %w", err)
			}
			out := cmd.OutOrStdout()
			if quiet {
				for _, sb := range sbs {
					if _, err := fmt.Fprintln(out, sb.ID); err != nil {
						return err
					}
				}
				return nil
			}
			if g.json {
				infos := make([]pandastack.SandboxInfo, len(sbs))
				for i, sb := range sbs {
					infos[i] = sb.Info
				}
				return printJSON(out, map[string]any{"sandboxes": infos})
			}
			t := newTable(out, "ID", "TEMPLATE", "STATE", "HOST", "MEMORY", "PRIVATE", "SHARED", "VCPUS", "CREATED", "EXPIRES", "PARENT", "METADATA")
			for _, sb := range sbs {
				i := sb.Info
				priv, shared := usage(i.Memory)
				t.row(i.ID, i.Template, stateText(i), orDash(i.HostID), mib(i.MemoryMiB), priv, shared, num(i.VCPUs), when(i.CreatedAt), when(i.ExpiresAt), orDash(i.ParentID), labels(i.Metadata))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state: starting, running, pausing, paused, resuming, stopping, stopped")
	cmd.Flags().StringArrayVar(&meta, "meta", nil, "only sandboxes with this metadata KEY=VALUE (repeatable)")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the ids, one per line (panda kill $(panda ls -q))")
	return cmd
}

// stateText is the state, with the reason of a stop or the last failed
// operation.
func stateText(i pandastack.SandboxInfo) string {
	switch {
	case i.StopReason != "":
		return string(i.State) + " (" + i.StopReason + ")"
	case i.LastError != "":
		return string(i.State) + " (" + i.LastError + ")"
	}
	return string(i.State)
}

// labels formats metadata as k=v,k=v sorted by key.
func labels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for i, k := range ks {
		ks[i] = k + "=" + m[k]
	}
	return strings.Join(ks, ",")
}

func getCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show a sandbox",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printSandbox(cmd.OutOrStdout(), g, sb.Info)
		},
	}
}

// printSandbox prints one sandbox, as JSON or as "field: value" lines.
func printSandbox(w io.Writer, g *globals, i pandastack.SandboxInfo) error {
	if g.json {
		return printJSON(w, i)
	}
	t := newTable(w, "id:", i.ID)
	t.row("template:", i.Template)
	t.row("state:", stateText(i))
	t.row("memory:", mib(i.MemoryMiB))
	if i.Memory != nil {
		priv, shared := usage(i.Memory)
		t.row("host memory:", fmt.Sprintf("%s private, %s shared, %.1f MiB PSS", priv, shared, i.Memory.PSSMiB))
	}
	t.row("vcpus:", num(i.VCPUs))
	if i.ParentID != "" {
		t.row("forked from:", i.ParentID)
	}
	if i.SnapshotID != "" {
		t.row("snapshot:", i.SnapshotID)
	}
	t.row("created:", i.CreatedAt.Local().Format("2006-01-02 15:04:05")+" ("+when(i.CreatedAt)+")")
	if !i.ExpiresAt.IsZero() {
		t.row("expires:", i.ExpiresAt.Local().Format("2006-01-02 15:04:05")+" ("+when(i.ExpiresAt)+")")
	}
	if i.OnExpire != "" {
		t.row("on expire:", i.OnExpire)
	}
	if i.HostID != "" {
		t.row("host:", i.HostID)
	}
	if i.NetworkOff {
		t.row("network:", "off (its host runs without sandbox networking; policy: "+networkText(i.Network)+")")
	} else {
		t.row("network:", networkText(i.Network))
	}
	t.row("metadata:", labels(i.Metadata))
	for _, v := range i.Volumes {
		t.row("volume:", mountText(v))
	}
	return t.flush()
}

func killCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "kill ID...",
		Aliases: []string{"rm"},
		Short:   "Kill sandboxes and free everything they used",
		Args:    args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			killed := []string{}
			var failed []error
			for _, id := range args {
				if err := c.Sandbox(id).Kill(cmd.Context()); err != nil {
					failed = append(failed, fmt.Errorf("kill %s: %w", id, err))
					continue
				}
				killed = append(killed, id)
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), id)
				}
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), map[string]any{"killed": killed}); err != nil {
					return err
				}
			}
			return errors.Join(failed...)
		},
	}
}

func ttlCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ttl ID SECONDS",
		Short: "Set a sandbox to expire SECONDS from now",
		Args:  args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			secs, err := strconv.Atoi(args[1])
			if err != nil || secs < 1 {
				return fmt.Errorf("SECONDS %q: want a whole number of seconds, at least 1", args[1])
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			if err := sb.SetTTL(cmd.Context(), secs); err != nil {
				return fmt.Errorf("set ttl of %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sb.Info)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s expires at %s (%s)\n", sb.ID, sb.Info.ExpiresAt.Local().Format("15:04:05"), when(sb.Info.ExpiresAt))
			return err
		},
	}
}

// stateCmd is pause or resume.
func stateCmd(g *globals, use, short string, do func(*pandastack.Sandbox, *cobra.Command) error) *cobra.Command {
	return &cobra.Command{
		Use:   use + " ID",
		Short: short,
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			if err := do(sb, cmd); err != nil {
				return fmt.Errorf("%s %s: %w", use, args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sb.Info)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", sb.ID, sb.Info.State)
			return err
		},
	}
}

func pauseCmd(g *globals) *cobra.Command {
	return stateCmd(g, "pause", "Pause a sandbox: its memory and device state go to disk and its VM stops (no memory held)",
		func(sb *pandastack.Sandbox, cmd *cobra.Command) error { return sb.Pause(cmd.Context()) })
}

func resumeCmd(g *globals) *cobra.Command {
	var host string
	cmd := stateCmd(g, "resume", "Resume a paused sandbox from its saved state (its TTL starts again)",
		func(sb *pandastack.Sandbox, cmd *cobra.Command) error {
			if !cmd.Flags().Changed("host") {
				return sb.Resume(cmd.Context())
			}
			if host == "" {
				return errors.New("--host needs a host id (see panda hosts)")
			}
			return sb.ResumeOn(cmd.Context(), pandastack.OnHost(host))
		})
	cmd.Example = `  panda resume $ID
  panda resume $ID --host h2   # on a fleet: on host h2, from the object store`
	cmd.Flags().StringVar(&host, "host", "", "resume on this host (see panda hosts; default: where it was paused); on a fleet whose hosts share an object store")
	return cmd
}

func forkCmd(g *globals) *cobra.Command {
	var (
		n       int
		host    string
		spread  bool
		volumes string
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Copy a running sandbox (memory, disk and processes) N times; prints the children's ids",
		Example: `  panda fork $ID -n 4
  panda fork $ID -n 3 --spread     # children over the fleet's hosts, the parent's first
  panda fork $ID --host h2         # the child on host h2
  panda fork $ID --volumes branch  # the child gets its own copy of each volume`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return fmt.Errorf("--count must be at least 1, not %d", n)
			}
			if volumes != "" && volumes != pandastack.VolumeShare && volumes != pandastack.VolumeBranch {
				return fmt.Errorf("--volumes must be share or branch, not %q", volumes)
			}
			opts := pandastack.ForkOptions{Count: n, VolumeMode: volumes}
			if cmd.Flags().Changed("host") {
				if spread {
					return errors.New("--host and --spread cannot be used together: --host puts every child on one host, --spread spreads them over hosts")
				}
				if host == "" {
					return errors.New("--host needs a host id (see panda hosts)")
				}
				opts.Placement = pandastack.OnHost(host)
			} else if spread {
				opts.Placement = pandastack.Spread()
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			res, err := sb.ForkWithOptions(cmd.Context(), opts)
			kids := res.Children
			var fe *pandastack.ForkError
			if err != nil && !errors.As(err, &fe) {
				return fmt.Errorf("fork %s: %w", args[0], err)
			}
			out := cmd.OutOrStdout()
			if g.json {
				infos := []pandastack.SandboxInfo{}
				for _, k := range kids {
					infos = append(infos, k.Info)
				}
				var fails []*pandastack.Error
				if fe != nil {
					fails = fe.Failures
				}
				if perr := printJSON(out, map[string]any{"children": infos, "errors": fails}); perr != nil {
					return perr
				}
			} else {
				for _, k := range kids {
					fmt.Fprintln(out, k.ID)
				}
			}
			if fe != nil {
				for _, f := range fe.Failures {
					fmt.Fprintf(cmd.ErrOrStderr(), "panda: fork %s: %v\n", args[0], f)
				}
				return fmt.Errorf("fork %s: %d of %d children failed", args[0], len(fe.Failures), n)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "children to make")
	cmd.Flags().StringVar(&host, "host", "", "make the children on this host (see panda hosts; default: the parent's host while it has room)")
	cmd.Flags().BoolVar(&spread, "spread", false, "spread the children over the ready hosts, the parent's host first")
	cmd.Flags().StringVar(&volumes, "volumes", "", "the children's volumes: share (the parent's; the default) or branch (a copy each, named VOLUME-CHILD)")
	return cmd
}

// usage formats a running sandbox's private and shared host memory.
func usage(m *pandastack.MemoryUsage) (private, shared string) {
	if m == nil {
		return "-", "-"
	}
	return fmt.Sprintf("%.1f MiB", m.PrivateMiB), fmt.Sprintf("%.1f MiB", m.SharedMiB)
}
