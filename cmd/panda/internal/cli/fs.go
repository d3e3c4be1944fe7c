package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

func fsCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "fs",
		Short: "Move files in and out of sandboxes, list and change them",
	})
	cmd.AddCommand(fsPutCmd(g), fsGetCmd(g), fsLsCmd(g), fsStatCmd(g), fsRmCmd(g), fsMkdirCmd(g), fsMvCmd(g), fsWatchCmd(g))
	return cmd
}

func fsPutCmd(g *globals) *cobra.Command {
	var modeFlag string
	cmd := &cobra.Command{
		Use:   "put ID LOCAL REMOTE",
		Short: "Upload LOCAL (- for standard input) to the absolute path REMOTE (streamed)",
		Long: `Upload a file. LOCAL is a local file, or - for standard input; REMOTE is an
absolute path in the sandbox (ending in / to keep LOCAL's name). Parent
directories are created, and the file appears only once complete. The mode is
LOCAL's permission bits unless --mode is given.`,
		Args: args(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			return putFile(cmd, g, args[1], args[2], modeFlag, sb.WriteFile)
		},
	}
	cmd.Flags().StringVar(&modeFlag, "mode", "", "permission bits in octal (default LOCAL's, or 644 for standard input)")
	return cmd
}

func fsGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID REMOTE [LOCAL|-]",
		Short: "Download REMOTE to LOCAL (default: its name in the current directory; - for standard output)",
		Args:  args(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			return getFile(cmd, g, args[1], args[2:], sb.ReadFile)
		},
	}
}

// writeFunc and readFunc are a sandbox's or a volume's file calls.
type (
	writeFunc func(ctx context.Context, p string, r io.Reader, mode os.FileMode) (pandastack.FileInfo, error)
	readFunc  func(ctx context.Context, p string) (io.ReadCloser, error)
	listFunc  func(ctx context.Context, p string) ([]pandastack.FileInfo, error)
)

// putFile uploads local (- for standard input) to remote with write:
// the body of fs put and volume put.
func putFile(cmd *cobra.Command, g *globals, local, remote, modeFlag string, write writeFunc) error {
	var (
		r    io.Reader
		mode os.FileMode
	)
	if local == "-" {
		r = cmd.InOrStdin()
	} else {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if st.IsDir() {
			return fmt.Errorf("%s is a directory: put uploads one file", local)
		}
		r, mode = f, st.Mode().Perm()
		if strings.HasSuffix(remote, "/") {
			remote += filepath.Base(local)
		}
	}
	if modeFlag != "" {
		m, err := strconv.ParseUint(modeFlag, 8, 32)
		if err != nil || m > 0o7777 {
			return fmt.Errorf("--mode %q: want octal permission bits like 644", modeFlag)
		}
		mode = os.FileMode(m)
	}
	fi, err := write(cmd.Context(), remote, r, mode)
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), fi)
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s  %d bytes  %04o\n", fi.Path, fi.Size, fi.Mode)
	return err
}

// getFile downloads remote with read to args' LOCAL (its base name in the
// current directory when left out; - for standard output): the body of fs
// get and volume get.
func getFile(cmd *cobra.Command, g *globals, remote string, localArg []string, read readFunc) error {
	local := path.Base(remote)
	if len(localArg) > 0 {
		local = localArg[0]
	}
	if local == "/" || local == "." {
		return fmt.Errorf("REMOTE %q names no file: give LOCAL", remote)
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	rc, err := read(cmd.Context(), remote)
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		if err != nil {
			return fmt.Errorf("download %s: %w", remote, err)
		}
		return nil
	}
	n, err := writeLocal(local, rc)
	if err != nil {
		return fmt.Errorf("download %s: %w", remote, err)
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), map[string]any{"path": local, "size": n})
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s  %d bytes\n", local, n)
	return err
}

// listFiles prints the directory p as listed by list: the body of fs ls
// and volume ls-files.
func listFiles(cmd *cobra.Command, g *globals, p string, list listFunc) error {
	entries, err := list(cmd.Context(), p)
	if err != nil {
		return err
	}
	if g.json {
		if entries == nil {
			entries = []pandastack.FileInfo{}
		}
		return printJSON(cmd.OutOrStdout(), map[string]any{"entries": entries})
	}
	t := newTable(cmd.OutOrStdout(), "MODE", "SIZE", "MODIFIED", "NAME")
	for _, e := range entries {
		t.row(modeText(e), strconv.FormatInt(e.Size, 10), when(e.ModifiedAt), nameText(e))
	}
	return t.flush()
}

// writeLocal writes r to name through a temporary file in the same
// directory, so that a failed download leaves no partial file.
func writeLocal(name string, r io.Reader) (int64, error) {
	tmp := fmt.Sprintf("%s.panda-%d.tmp", name, os.Getpid())
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return 0, err
	}
	return n, nil
}

func fsLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls ID [PATH]",
		Short: "List a directory (default /)",
		Args:  args(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := "/"
			if len(args) == 2 {
				p = args[1]
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			return listFiles(cmd, g, p, sb.ListFiles)
		},
	}
}

func fsStatCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stat ID PATH",
		Short: "Describe a file (without following a final symlink)",
		Args:  args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			fi, err := sb.Stat(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), fi)
			}
			t := newTable(cmd.OutOrStdout(), "path:", fi.Path)
			t.row("mode:", modeText(fi))
			t.row("size:", strconv.FormatInt(fi.Size, 10))
			if !fi.ModifiedAt.IsZero() {
				t.row("modified:", fi.ModifiedAt.Local().Format("2006-01-02 15:04:05"))
			}
			if fi.IsSymlink {
				t.row("target:", fi.LinkTarget)
			}
			return t.flush()
		},
	}
}

// modeText is like ls -l: drwxr-xr-x.
func modeText(fi pandastack.FileInfo) string {
	m := fi.Mode.Perm()
	switch {
	case fi.IsSymlink:
		m |= os.ModeSymlink
	case fi.IsDir:
		m |= os.ModeDir
	}
	return m.String()
}

// nameText is the name, with / for directories and -> target for links.
func nameText(fi pandastack.FileInfo) string {
	switch {
	case fi.IsSymlink:
		return fi.Name + " -> " + fi.LinkTarget
	case fi.IsDir:
		return fi.Name + "/"
	}
	return fi.Name
}

func fsRmCmd(g *globals) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "rm [-r] ID PATH...",
		Short: "Remove files (and with -r, directories and everything in them)",
		Args:  args(2, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			var failed []error
			for _, p := range args[1:] {
				if err := sb.Remove(cmd.Context(), p, recursive); err != nil {
					failed = append(failed, err)
				}
			}
			return errors.Join(failed...)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "remove directories and their contents")
	return cmd
}

func fsMkdirCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mkdir ID PATH",
		Short: "Create a directory and its parents (like mkdir -p)",
		Args:  args(2, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			fi, err := sb.Mkdir(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), fi)
			}
			return nil
		},
	}
}

func fsMvCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mv ID FROM TO",
		Short: "Rename or move a file or directory",
		Args:  args(3, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			fi, err := sb.Rename(cmd.Context(), args[1], args[2])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), fi)
			}
			return nil
		},
	}
}
