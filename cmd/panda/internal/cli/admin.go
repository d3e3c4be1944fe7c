package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
)

func templateCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "template",
		Aliases: []string{"templates"},
		Short:   "List, bake, build and remove templates",
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "ls [NAME]",
		Short: "List templates, one line per baked shape; with NAME, that template's versions",
		Long: `List the templates this key may use, one line per baked shape: the
built-in ones, its own and the published versions of others' (an admin
key: all). A user template's VERSION is the version of that line
(NAME:VERSION pins it for --template), SIZE the disk space its root
filesystem takes, BUILT when it was built. With NAME, list that
template's versions instead.`,
		Args: args(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return fmt.Errorf("list templates: %w", err)
			}
			if len(args) == 1 {
				return listTemplateVersions(cmd, g, ts, args[0])
			}
			if g.json {
				if ts == nil {
					ts = []pandastack.Template{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"templates": ts})
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "VERSION", "MEMORY", "VCPUS", "STATE", "BAKED", "BAKE TIME", "SIZE", "BUILT", "IMAGE")
			for _, tp := range ts {
				state := tp.State
				if tp.StaleReason != "" {
					state += " (" + tp.StaleReason + ")"
				}
				bake := "-"
				if tp.BakeMS > 0 {
					bake = fmt.Sprintf("%.1fs", float64(tp.BakeMS)/1000)
				}
				version := "-"
				if tp.Version > 0 {
					version = fmt.Sprint(tp.Version)
					if tp.Version == tp.LatestVersion {
						version += " (latest)"
					}
					for _, v := range tp.Versions {
						if v.Version == tp.Version && v.Published {
							version += ", published"
						}
					}
				}
				t.row(tp.Name, version, mib(tp.MemoryMiB), num(tp.VCPUs), state, when(tp.BakedAt), bake,
					diskSize(tp.DiskBytes), when(tp.BuiltAt), orDash(tp.FromImage))
			}
			return t.flush()
		},
	})
	var mem, vcpus int
	bake := &cobra.Command{
		Use:   "bake NAME",
		Short: "Bake (or re-bake) a template for a shape, showing progress (admin keys only)",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			pw := g.progressOut(cmd)
			tp, err := c.BakeTemplate(cmd.Context(), args[0], mem, vcpus, func(msg string) { fmt.Fprintln(pw, msg) })
			if err != nil {
				return fmt.Errorf("bake %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), tp)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "baked %s (%s, %s vCPUs) in %.1fs\n", tp.Name, mib(tp.MemoryMiB), num(tp.VCPUs), float64(tp.BakeMS)/1000)
			return err
		},
	}
	bake.Flags().IntVar(&mem, "memory", 0, "guest memory in MiB (default: the server's)")
	bake.Flags().IntVar(&vcpus, "vcpus", 0, "guest vCPUs (default: the server's)")
	cmd.AddCommand(bake)
	cmd.AddCommand(templateBuildCmd(g), templateRmCmd(g), templatePublishCmd(g, true), templatePublishCmd(g, false))
	return cmd
}

// listTemplateVersions prints the versions of user template name.
func listTemplateVersions(cmd *cobra.Command, g *globals, ts []pandastack.Template, name string) error {
	var tp *pandastack.Template
	for i := range ts {
		if ts[i].Name == name {
			tp = &ts[i]
			break
		}
	}
	if tp == nil {
		return fmt.Errorf("template %s: not found", name)
	}
	if g.json {
		vs := tp.Versions
		if vs == nil {
			vs = []pandastack.TemplateVersion{}
		}
		return printJSON(cmd.OutOrStdout(), map[string]any{"name": name, "latest_version": tp.LatestVersion, "public": tp.Public, "owner": tp.Owner, "versions": vs})
	}
	if len(tp.Versions) == 0 {
		_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s is a built-in template: it has no versions\n", name)
		return err
	}
	t := newTable(cmd.OutOrStdout(), "TEMPLATE", "SIZE", "APPARENT", "BUILT", "BUILD TIME", "IMAGE", "DIGEST")
	for _, v := range tp.Versions {
		ref := pandastack.TemplateRef(name, v.Version)
		var notes []string
		if v.Version == tp.LatestVersion {
			notes = append(notes, "latest")
		}
		if v.Published {
			notes = append(notes, "published")
		}
		if len(notes) > 0 {
			ref += " (" + strings.Join(notes, ", ") + ")"
		}
		t.row(ref, diskSize(v.DiskBytes), diskSize(v.SizeBytes), when(v.BuiltAt), fmt.Sprintf("%.1fs", float64(v.BuildMS)/1000),
			orDash(v.FromImage), orDash(v.Digest))
	}
	return t.flush()
}

// diskSize formats a byte count in MiB (GiB from 10 GiB), "-" for zero.
func diskSize(n int64) string {
	switch {
	case n <= 0:
		return "-"
	case n >= 10<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

func templatePublishCmd(g *globals, public bool) *cobra.Command {
	use, short := "publish NAME[:VERSION]", "Publish a version of a template (the latest, or VERSION) for every key (admin keys only)"
	long := `Publish one version of a user template: NAME publishes its latest version
(as it is now), NAME:VERSION that version. Every key may then list it and
create sandboxes from it; for keys other than the owner, --template NAME
means the latest published version. Publishing is per version: a version
the owner builds later is its own until it is published in turn.`
	if !public {
		use, short = "unpublish NAME[:VERSION]", "Withdraw a published version of a template, or every version of NAME (admin keys only)"
		long = `Withdraw published versions of a user template: NAME:VERSION that version,
NAME every version. Sandboxes made from them keep running.`
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.PublishTemplate(cmd.Context(), args[0], public); err != nil {
				return fmt.Errorf("%s %s: %w", strings.Fields(use)[0], args[0], err)
			}
			return nil
		},
	}
}

func templateBuildCmd(g *globals) *cobra.Command {
	var from, file, startCmd, readyCmd string
	var buildArgs []string
	var readyTimeout time.Duration
	build := &cobra.Command{
		Use:   "build NAME (--from-image REF | -f DOCKERFILE [CONTEXT_DIR]) [--start-cmd CMD [--ready-cmd CMD]]",
		Short: "Build a template (a new version of it) from a container image or a Dockerfile, showing progress",
		Long: `Build template NAME from a container image in a registry (--from-image), or
from a Dockerfile (-f), showing the build's progress. Sandboxes created
with --template NAME then start from it (the first create bakes it). The
image's ENV, WORKDIR and USER become the defaults of their commands (an
exec's own env, cwd and --user win). Building NAME again makes a new
version: sandboxes made earlier keep theirs, and --template NAME:VERSION
pins one (panda template ls NAME). A new NAME is this key's own, private
to it until an admin key publishes a version (panda template publish
NAME[:VERSION]); a rebuild is private again until it is published.

With -f, the build context is CONTEXT_DIR (default: the Dockerfile's
directory), sent to the server as a compressed tar archive, streamed from
disk. Its .dockerignore leaves files out, with Docker's rules (# comments,
*, **, ! exceptions; the last matching line wins); symbolic links are sent
as links, never followed. "-f -" reads the Dockerfile from stdin, with no
context unless CONTEXT_DIR is given. --build-arg sets the Dockerfile's
ARGs. FROM names a registry image, or base or tiny (the built-in root
filesystems). Each RUN runs in a build VM; each step's result is cached,
so a rebuild runs only the steps after the first one that changed (see
docs/dockerfile.md).

With --start-cmd, the template's snapshot is taken with that command
running in the background (a /bin/sh -c script; output in
/var/log/start.log in the guest): every sandbox of it starts with the
process already running, each its own copy. --ready-cmd is run until it
exits 0 before the snapshot is taken (each run at most 10 s, all of them
at most --ready-timeout). The build then bakes the template at the
server's default shape, and fails, keeping nothing, if the command does
not get ready.`,
		Example: `  panda template build myapp --from-image registry.example.com/myapp:1.0
  panda create --template myapp
  panda template build web --from-image registry.example.com/web:1.0 \
      --start-cmd 'exec /app/server --port 8000' \
      --ready-cmd 'wget -q -O /dev/null http://127.0.0.1:8000/health'
  panda template build api -f ./api/Dockerfile --build-arg VERSION=1.2
  panda template build tools -f - < Dockerfile.tools`,
		Args: args(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case from != "" && file != "":
				return errors.New("give --from-image or -f, not both")
			case from == "" && file == "":
				return errors.New("--from-image REF or -f DOCKERFILE is required")
			case from != "" && len(args) > 1:
				return errors.New("CONTEXT_DIR is for Dockerfile builds (-f); an image build takes none")
			case from != "" && len(buildArgs) > 0:
				return errors.New("--build-arg is for Dockerfile builds (-f)")
			case readyTimeout < 0:
				return errors.New("--ready-timeout must not be negative")
			}
			var opts []pandastack.BuildOption
			if startCmd != "" {
				opts = append(opts, pandastack.WithStartCmd(startCmd))
			}
			if readyCmd != "" {
				opts = append(opts, pandastack.WithReadyCmd(readyCmd))
			}
			if readyTimeout > 0 {
				opts = append(opts, pandastack.WithReadyTimeout(readyTimeout))
			}
			var dockerfile, contextDir string
			if file != "" {
				for _, kv := range buildArgs {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						return fmt.Errorf("--build-arg %q: want KEY=VALUE", kv)
					}
					opts = append(opts, pandastack.WithBuildArg(k, v))
				}
				var err error
				if dockerfile, contextDir, err = readDockerfile(cmd.InOrStdin(), file, args[1:]); err != nil {
					return err
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			pw := g.progressOut(cmd)
			line := func(l string) { fmt.Fprintln(pw, l) }
			var b pandastack.TemplateBuild
			if file == "" {
				b, err = c.BuildTemplate(cmd.Context(), args[0], from, line, opts...)
			} else {
				b, err = buildDockerfile(cmd.Context(), c, args[0], dockerfile, contextDir, pw, line, opts)
			}
			if err != nil {
				return fmt.Errorf("build %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), b)
			}
			return nil
		},
	}
	build.Flags().StringVar(&from, "from-image", "", "the image: a registry reference (registry.example.com/app:1.0)")
	build.Flags().StringVarP(&file, "file", "f", "", "the Dockerfile to build (- for stdin)")
	build.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "KEY=VALUE: a value of the Dockerfile's ARG KEY (repeatable)")
	build.Flags().StringVar(&startCmd, "start-cmd", "", "a command to have running in every sandbox of the template (started before its snapshot)")
	build.Flags().StringVar(&readyCmd, "ready-cmd", "", "a command that exits 0 once the start command is ready; the snapshot waits for it")
	build.Flags().DurationVar(&readyTimeout, "ready-timeout", 0, "how long to wait for --ready-cmd to succeed (default 60s)")
	return build
}

// maxDockerfile bounds the Dockerfile read (the server's limit).
const maxDockerfile = 1 << 20

// readDockerfile reads the Dockerfile of -f file (- for stdin) and
// returns it with the context directory: rest[0] if given, else the
// Dockerfile's directory (none for stdin).
func readDockerfile(stdin io.Reader, file string, rest []string) (dockerfile, contextDir string, err error) {
	var b []byte
	if file == "-" {
		b, err = io.ReadAll(io.LimitReader(stdin, maxDockerfile+1))
		if err != nil {
			return "", "", fmt.Errorf("read the Dockerfile from stdin: %w", err)
		}
	} else {
		fi, err := os.Stat(file)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", "", fmt.Errorf("Dockerfile %s: no such file", file)
		case err != nil:
			return "", "", fmt.Errorf("Dockerfile: %w", err)
		case fi.IsDir():
			return "", "", fmt.Errorf("Dockerfile %s is a directory; -f names the file (%s)", file, filepath.Join(file, "Dockerfile"))
		case fi.Size() > maxDockerfile:
			return "", "", fmt.Errorf("Dockerfile %s is larger than %d bytes", file, maxDockerfile)
		}
		if b, err = os.ReadFile(file); err != nil {
			return "", "", fmt.Errorf("Dockerfile: %w", err)
		}
		contextDir = filepath.Dir(file)
	}
	if len(b) > maxDockerfile {
		return "", "", fmt.Errorf("the Dockerfile is larger than %d bytes", maxDockerfile)
	}
	if strings.TrimSpace(string(b)) == "" {
		return "", "", errors.New("the Dockerfile is empty")
	}
	if len(rest) > 0 {
		contextDir = rest[0]
	}
	if contextDir != "" {
		fi, err := os.Stat(contextDir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", "", fmt.Errorf("context %s: no such directory", contextDir)
		case err != nil:
			return "", "", fmt.Errorf("context: %w", err)
		case !fi.IsDir():
			return "", "", fmt.Errorf("context %s is not a directory", contextDir)
		}
	}
	return string(b), contextDir, nil
}

// buildDockerfile starts a Dockerfile build, saying on pw what context it
// sent, and follows its log to its end.
func buildDockerfile(ctx context.Context, c *pandastack.Client, name, dockerfile, contextDir string, pw io.Writer, line func(string), opts []pandastack.BuildOption) (pandastack.TemplateBuild, error) {
	var sent pandastack.ContextStats
	if contextDir != "" {
		opts = append(opts, pandastack.WithContextProgress(func(s pandastack.ContextStats) { sent = s }))
	}
	b, err := c.StartDockerfileBuild(ctx, name, dockerfile, contextDir, opts...)
	if contextDir != "" && (err == nil || sent.Files > 0) {
		fmt.Fprintf(pw, "sending context: %d files, %s\n", sent.Files, humanSize(sent.Bytes))
	}
	if err != nil {
		return b, err
	}
	b, err = c.FollowTemplateBuild(ctx, b.ID, line)
	if err != nil {
		return b, err
	}
	if b.Status != pandastack.BuildSucceeded {
		return b, &pandastack.Error{Code: b.Code, Message: b.Error}
	}
	return b, nil
}

// humanSize is n bytes for people: 512 B, 3.4 MiB.
func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGT"[i])
}

func templateRmCmd(g *globals) *cobra.Command {
	var force bool
	rm := &cobra.Command{
		Use:     "rm NAME[:VERSION]",
		Aliases: []string{"delete"},
		Short:   "Remove a template built from an image (every version, every shape baked), or one version of it",
		Long: `Remove user template NAME: every version and every shape baked from
them; or NAME:VERSION, that version only (not the latest: remove the
template, or build a newer version first). Refused while sandboxes that
are not stopped, or snapshots, were made from it, unless --force (they
keep working from their own files). Its owner or an admin key only.`,
		Args: args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteTemplate(cmd.Context(), args[0], force); err != nil {
				return fmt.Errorf("remove template %s: %w", args[0], cliForce(err))
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "remove it even while sandboxes or snapshots of it exist (they keep working)")
	return rm
}

// cliForce turns the API's "?force=true" in the refusal of a template in
// use into the CLI's flag, --force.
func cliForce(err error) error {
	var pe *pandastack.Error
	if !errors.As(err, &pe) || pe.Code != pandastack.CodeConflict || !strings.Contains(pe.Message, "?force=true") {
		return err
	}
	e := *pe
	e.Message = strings.ReplaceAll(e.Message, "delete with ?force=true", "remove it with --force")
	e.Message = strings.ReplaceAll(e.Message, "?force=true", "--force")
	return &e
}

func keysCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "keys",
		Aliases: []string{"key"},
		Short:   "Manage API keys (admin keys only)",
	})
	var (
		admin bool
		q     pandastack.Quotas
	)
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and print its secret (shown only once)",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), args[0], admin, q)
			if err != nil {
				return fmt.Errorf("create key: %w", err)
			}
			if g.json {
				err = printJSON(cmd.OutOrStdout(), k)
			} else {
				_, err = fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "Created key %s (%s). Store its secret now: it is not shown again.\n", k.ID, k.Name)
			return err
		},
	}
	create.Flags().BoolVar(&admin, "admin", false, "the key can manage keys and bake templates")
	create.Flags().IntVar(&q.MaxSandboxes, "max-sandboxes", 0, "concurrent sandboxes allowed (default: the server's)")
	create.Flags().IntVar(&q.MaxMemoryMiB, "max-memory", 0, "total guest memory allowed in MiB (default: the server's)")
	create.Flags().IntVar(&q.MaxVCPUs, "max-vcpus", 0, "total vCPUs allowed (default: the server's)")
	create.Flags().IntVar(&q.MaxDiskMiB, "max-disk", 0, "disk allowed in MiB: sandbox disks, paused sandboxes, snapshots (default: the server's)")
	cmd.AddCommand(create)

	var all bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List API keys (without their secrets); --all includes revoked ones",
		Args:  args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			keys, err := c.ListKeys(cmd.Context())
			if err != nil {
				return fmt.Errorf("list keys: %w", err)
			}
			if !all {
				keys = slices.DeleteFunc(keys, func(k pandastack.APIKey) bool { return k.Revoked })
			}
			if g.json {
				if keys == nil {
					keys = []pandastack.APIKey{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"keys": keys})
			}
			t := newTable(cmd.OutOrStdout(), "ID", "NAME", "STATE", "ADMIN", "PREFIX", "MAX SANDBOXES", "MAX MEMORY", "MAX VCPUS", "MAX DISK", "CREATED")
			for _, k := range keys {
				state := "active"
				if k.Revoked {
					state = "revoked"
				}
				t.row(k.ID, k.Name, state, strconv.FormatBool(k.Admin), orDash(k.Prefix), num(k.MaxSandboxes), mib(k.MaxMemoryMiB),
					num(k.MaxVCPUs), mib(k.MaxDiskMiB), when(k.CreatedAt))
			}
			return t.flush()
		},
	}
	ls.Flags().BoolVar(&all, "all", false, "include revoked keys")
	cmd.AddCommand(ls)
	var purge bool
	revoke := &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke API keys; their sandboxes are killed, their template builds canceled (--purge: their snapshots and templates deleted too)",
		Args:  args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachID(cmd, g, args, "revoke", func(ctx context.Context, c *pandastack.Client, id string) error {
				if err := c.RevokeKey(ctx, id); err != nil {
					return err
				}
				if !purge {
					return nil
				}
				return purgeKey(cmd, g, c, id)
			})
		},
	}
	revoke.Flags().BoolVar(&purge, "purge", false, "then delete what the key left: its snapshots and templates (as keys purge)")
	cmd.AddCommand(revoke)
	cmd.AddCommand(&cobra.Command{
		Use:   "purge ID...",
		Short: "Delete what revoked API keys left: their snapshots (disk and object store) and templates; nothing of other keys",
		Args:  args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachID(cmd, g, args, "purge", func(ctx context.Context, c *pandastack.Client, id string) error {
				return purgeKey(cmd, g, c, id)
			})
		},
	})
	return cmd
}

// purgeKey purges key id and prints what went (JSON with --json); what
// could not be removed is an error.
func purgeKey(cmd *cobra.Command, g *globals, c *pandastack.Client, id string) error {
	res, err := c.PurgeKey(cmd.Context(), id)
	if err != nil {
		return err
	}
	if g.json {
		if err := printJSON(cmd.OutOrStdout(), res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "Purged key %s: %d template builds canceled, %d sandboxes stopped, %d snapshots deleted, %d templates deleted%s\n",
			id, res.BuildsCanceled, res.SandboxesStopped, res.SnapshotsDeleted, len(res.TemplatesDeleted), listed(res.TemplatesDeleted))
	}
	var failed []error
	for _, f := range res.Failed {
		failed = append(failed, fmt.Errorf("%s: %s (run keys purge %s again to retry)", f.What, f.Error.Message, id))
	}
	return errors.Join(failed...)
}

// listed is names as " (a, b)", or "" for none.
func listed(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return " (" + strings.Join(names, ", ") + ")"
}

func snapshotCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Save sandboxes as snapshots, list and delete them",
	})
	var name string
	create := &cobra.Command{
		Use:   "create ID",
		Short: "Save a sandbox's memory and disk; prints the snapshot's id",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			snap, err := sb.Snapshot(cmd.Context(), name)
			if err != nil {
				return fmt.Errorf("snapshot %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), snap)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), snap.ID)
			return err
		},
	}
	create.Flags().StringVar(&name, "name", "", "a name for the snapshot")
	cmd.AddCommand(create)
	cmd.AddCommand(&cobra.Command{
		Use:   "ls",
		Short: "List your snapshots",
		Args:  args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			snaps, err := c.Snapshots(cmd.Context())
			if err != nil {
				return fmt.Errorf("list snapshots: %w", err)
			}
			if g.json {
				if snaps == nil {
					snaps = []pandastack.Snapshot{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"snapshots": snaps})
			}
			t := newTable(cmd.OutOrStdout(), "ID", "NAME", "SANDBOX", "TEMPLATE", "MEMORY", "SIZE", "STORED", "CREATED")
			for _, s := range snaps {
				size := "-"
				if s.SizeBytes > 0 {
					size = fmt.Sprintf("%.1f MiB", float64(s.SizeBytes)/(1<<20))
				}
				stored := orDash(s.Stored)
				if s.StoreError != "" {
					stored += " (" + s.StoreError + ")"
				}
				t.row(s.ID, orDash(s.Name), orDash(s.SandboxID), orDash(s.Template), mib(s.MemoryMiB), size, stored, when(s.CreatedAt))
			}
			return t.flush()
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "rm ID...",
		Short: "Delete snapshots",
		Args:  args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return eachID(cmd, g, args, "delete snapshot", func(ctx context.Context, c *pandastack.Client, id string) error {
				return c.DeleteSnapshot(ctx, id)
			})
		},
	})
	return cmd
}

func hostsCmd(g *globals) *cobra.Command {
	cmd := hostsListCmd(g)
	var migrate bool
	drain := &cobra.Command{
		Use:   "drain HOST",
		Short: "Stop placing sandboxes on a host (admin); --migrate moves its running ones elsewhere",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, a []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.DrainHost(cmd.Context(), a[0], migrate)
			if err != nil {
				return fmt.Errorf("drain %s: %w", a[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is %s\n", res.ID, res.State)
			for _, m := range res.Migrated {
				fmt.Fprintf(cmd.OutOrStdout(), "moved %s to %s\n", m.SandboxID, m.To)
			}
			for _, m := range res.Failed {
				fmt.Fprintf(cmd.OutOrStdout(), "could not move %s: %s\n", m.SandboxID, m.Error)
			}
			if len(res.Failed) > 0 {
				return fmt.Errorf("%d sandboxes could not move", len(res.Failed))
			}
			return nil
		},
	}
	drain.Flags().BoolVar(&migrate, "migrate", false, "also move its running sandboxes to other hosts (through the object store)")
	activate := &cobra.Command{
		Use:   "activate HOST",
		Short: "End a host's drain (admin)",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, a []string) error {
			return eachID(cmd, g, a, "activate", func(ctx context.Context, c *pandastack.Client, id string) error { return c.ActivateHost(ctx, id) })
		},
	}
	forget := &cobra.Command{
		Use:   "forget HOST",
		Short: "Remove a host from the fleet (admin; refused while it holds live sandboxes unless it is lost)",
		Args:  args(1, 1),
		RunE: func(cmd *cobra.Command, a []string) error {
			return eachID(cmd, g, a, "forget", func(ctx context.Context, c *pandastack.Client, id string) error { return c.ForgetHost(ctx, id) })
		},
	}
	cmd.AddCommand(drain, activate, forget)
	return cmd
}

func hostsListCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "hosts",
		Short: "List the hosts that run sandboxes (drain, activate, forget: a fleet's)",
		Args:  args(0, 0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			hosts, err := c.Hosts(cmd.Context())
			if err != nil {
				return fmt.Errorf("list hosts: %w", err)
			}
			if g.json {
				if hosts == nil {
					hosts = []pandastack.Host{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"hosts": hosts})
			}
			t := newTable(cmd.OutOrStdout(), "ID", "STATE", "ACCEL", "CPUS", "SANDBOXES", "MEMORY", "AVAILABLE", "ALLOCATED", "SANDBOXES PSS", "NETWORK", "TEMPLATES")
			for _, h := range hosts {
				t.row(h.ID, h.State, orDash(h.Accel), strconv.Itoa(h.VCPUs), strconv.Itoa(h.Sandboxes), mib(h.MemoryMiB), mib(h.MemoryAvailableMiB), mib(h.MemoryAllocatedMiB),
					fmt.Sprintf("%.1f MiB", h.SandboxesPSSMiB), hostNetwork(h), orDash(strings.Join(h.Templates, ",")))
			}
			return t.flush()
		},
	}
}

// hostNetwork is a host's sandbox networking: off, on, or "-" while a
// fleet's host cannot say (not connected).
func hostNetwork(h pandastack.Host) string {
	switch {
	case h.NetworkOff:
		return "off"
	case h.State == "ready" || h.State == "draining":
		return "on"
	}
	return "-"
}

// eachID runs fn for every id, going on after failures, and returns them
// all ("verb id: error" each).
func eachID(cmd *cobra.Command, g *globals, ids []string, verb string, fn func(context.Context, *pandastack.Client, string) error) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	var failed []error
	for _, id := range ids {
		if err := fn(cmd.Context(), c, id); err != nil {
			failed = append(failed, fmt.Errorf("%s %s: %w", verb, id, err))
		}
	}
	return errors.Join(failed...)
}

// progressOut is where a long command's progress lines go: stdout for
// people, stderr with --json (stdout then holds the JSON alone).
func (g *globals) progressOut(cmd *cobra.Command) io.Writer {
	if g.json {
		return cmd.ErrOrStderr()
	}
	return cmd.OutOrStdout()
}
