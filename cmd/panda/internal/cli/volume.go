package cli

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

// volumeCmd is `panda volume`: persistent volumes and their files.
func volumeCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes", "vol"},
		Short:   "Persistent volumes: create, list, resize, delete, promote, and their files",
		Long: `A volume is a named directory tree with a size limit that outlives sandboxes:
mount it with panda create --volume NAME:/PATH[:ro], and read or write its
files here whether or not a sandbox runs. See docs/volumes.md.`,
	})
	cmd.AddCommand(volumeCreateCmd(g), volumeLsCmd(g), volumeInfoCmd(g), volumeResizeCmd(g), volumeRmCmd(g),
		volumePromoteCmd(g), volumePutCmd(g), volumeGetCmd(g), volumeLsFilesCmd(g))
	return cmd
}

func volumeCreateCmd(g *globals) *cobra.Command {
	var size int
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an empty volume and print its name",
		Example: `  panda volume create data
  panda volume create datasets --size 10240`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if size < 1 {
				return fmt.Errorf("--size must be at least 1 (MiB), not %d", size)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return fmt.Errorf("create volume %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), v.Name)
			return err
		},
	}
	cmd.Flags().IntVar(&size, "size", pandastack.DefaultVolumeSizeMiB, "size limit in MiB")
	return cmd
}

func volumeLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List your volumes",
		Args:    args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			vols, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				if vols == nil {
					vols = []pandastack.Volume{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"volumes": vols})
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "SIZE", "USED", "MOUNTED BY", "PARENT", "CREATED")
			for _, v := range vols {
				t.row(v.Name, mib(v.SizeMiB), bytesText(v.UsedBytes), orDash(strings.Join(v.MountedBy, ",")), orDash(v.Parent), when(v.CreatedAt))
			}
			return t.flush()
		},
	}
}

func volumeInfoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "info NAME",
		Short: "Show a volume",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printVolume(cmd.OutOrStdout(), g, v)
		},
	}
}

// printVolume prints one volume, as JSON or as "field: value" lines.
func printVolume(w io.Writer, g *globals, v pandastack.Volume) error {
	if g.json {
		return printJSON(w, v)
	}
	t := newTable(w, "name:", v.Name)
	t.row("id:", v.ID)
	t.row("size:", mib(v.SizeMiB))
	used := bytesText(v.UsedBytes)
	if v.SizeMiB > 0 {
		used += fmt.Sprintf(" (%.1f%%)", 100*float64(v.UsedBytes)/float64(int64(v.SizeMiB)<<20))
	}
	t.row("used:", used)
	if v.Parent != "" {
		t.row("branched from:", v.Parent)
	}
	t.row("mounted by:", orDash(strings.Join(v.MountedBy, ", ")))
	t.row("created:", v.CreatedAt.Local().Format("2006-01-02 15:04:05")+" ("+when(v.CreatedAt)+")")
	return t.flush()
}

func volumeResizeCmd(g *globals) *cobra.Command {
	var size int
	cmd := &cobra.Command{
		Use:   "resize NAME --size MIB",
		Short: "Grow a volume's size limit (volumes only grow)",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("size") {
				return fmt.Errorf("--size is required\nusage: %s", cmd.UseLine())
			}
			if size < 1 {
				return fmt.Errorf("--size must be at least 1 (MiB), not %d", size)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.ResizeVolume(cmd.Context(), args[0], size)
			if err != nil {
				return fmt.Errorf("resize volume %s: %w", args[0], err)
			}
			return printVolume(cmd.OutOrStdout(), g, v)
		},
	}
	cmd.Flags().IntVar(&size, "size", 0, "the new size limit in MiB")
	return cmd
}

func volumeRmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete volumes and their files (--force: even while sandboxes mount them)",
		Args:    args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := 0
			for _, name := range args {
				if err := c.DeleteVolume(cmd.Context(), name, force); err != nil {
					failed++
					hint := ""
					if errors.Is(err, pandastack.ErrConflict) && !force {
						hint = " (sandboxes mount it: kill them, or use --force)"
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "panda: volume rm %s: %v%s\n", name, err, hint)
					continue
				}
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), name)
				}
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d volumes not deleted", failed, len(args))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even while running or paused sandboxes mount it")
	return cmd
}

func volumePromoteCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "promote NAME",
		Short: "Make a branch's files its parent volume's, and delete the branch",
		Long: `A fork with --volumes branch gives each child its own copy of each volume, a
branch named VOLUME-CHILD. promote replaces the parent volume's files with the
branch's and deletes the branch; it prints the parent.`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.PromoteVolume(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("promote volume %s: %w", args[0], err)
			}
			return printVolume(cmd.OutOrStdout(), g, v)
		},
	}
}

func volumePutCmd(g *globals) *cobra.Command {
	var modeFlag string
	cmd := &cobra.Command{
		Use:   "put NAME LOCAL REMOTE",
		Short: "Upload LOCAL (- for standard input) to REMOTE in the volume (streamed)",
		Long: `Upload a file into a volume. LOCAL is a local file, or - for standard input;
REMOTE is a path in the volume ("/a/b" and "a/b" alike; ending in / to keep
LOCAL's name). Parent directories are created. The command returns once the
data is on the host's disk: sandboxes that open the file afterwards see it.`,
		Args: args(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return putFile(cmd, g, args[1], args[2], modeFlag, c.VolumeFiles(args[0]).WriteFile)
		},
	}
	cmd.Flags().StringVar(&modeFlag, "mode", "", "permission bits in octal (default LOCAL's, or 644 for standard input)")
	return cmd
}

func volumeGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get NAME REMOTE [LOCAL|-]",
		Short: "Download REMOTE from the volume to LOCAL (default: its name here; - for standard output)",
		Args:  args(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return getFile(cmd, g, args[1], args[2:], c.VolumeFiles(args[0]).ReadFile)
		},
	}
}

func volumeLsFilesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls-files NAME [PATH]",
		Short: "List a directory of the volume (default its root)",
		Args:  args(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := "/"
			if len(args) == 2 {
				p = args[1]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			return listFiles(cmd, g, p, c.VolumeFiles(args[0]).ListFiles)
		},
	}
}

// volumeMounts parses --volume NAME:/PATH[:ro] flags.
func volumeMounts(vals []string) ([]pandastack.VolumeMount, error) {
	var out []pandastack.VolumeMount
	for _, v := range vals {
		name, rest, ok := strings.Cut(v, ":")
		if !ok || name == "" || !strings.HasPrefix(rest, "/") {
			return nil, fmt.Errorf("--volume %q: want NAME:/PATH or NAME:/PATH:ro", v)
		}
		m := pandastack.VolumeMount{Name: name, Path: rest}
		if p, opt, ok := strings.Cut(rest, ":"); ok {
			switch opt {
			case "ro":
				m.Path, m.ReadOnly = p, true
			case "rw":
				m.Path = p
			default:
				return nil, fmt.Errorf("--volume %q: the option after the path must be ro or rw, not %q", v, opt)
			}
		}
		if m.Path != path.Clean(m.Path) {
			return nil, fmt.Errorf("--volume %q: the path %q is not clean (write %s)", v, m.Path, path.Clean(m.Path))
		}
		out = append(out, m)
	}
	return out, nil
}

// mountText is a mount as --volume takes it: NAME:/PATH[:ro].
func mountText(m pandastack.VolumeMount) string {
	s := m.Name + ":" + m.Path
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

// bytesText formats a byte count with a binary unit.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
