package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/hostagent/template/rootfs"
	"github.com/spf13/cobra"
)

func rootfsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "rootfs",
		Short: "Guest root filesystems",
	}
	cmd.AddCommand(rootfsBuildCmd())
	return cmd
}

func rootfsBuildCmd() *cobra.Command {
	var (
		from  string
		out   string
		opts  rootfs.Options
		quiet bool
	)
	cmd := &cobra.Command{
		Use:   "build --from-image IMAGE --out FILE",
		Short: "Build an ext4 root filesystem from an OCI image",
		Long: `Flatten an OCI image's layers into an ext4 image usable as a template's root
filesystem (like rootfs-NAME.ext4 in the images directory). IMAGE is a
registry reference (credentials from the Docker config, else anonymous),
oci:DIR or an OCI layout directory, or docker-archive:FILE or a .tar made by
docker save. Of a multi-platform image, the linux/amd64 one is used. The
image's Env, WorkingDir, User, Entrypoint and Cmd are printed.

Needs root (the files get the image's owners) and e2fsprogs.`,
		Example: `  panda rootfs build --from-image python:3.12-slim --out images/rootfs-python.ext4
  panda rootfs build --from-image oci:./layout --out rootfs-app.ext4 --size-mib 2048`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if from == "" || out == "" {
				return errors.New("--from-image and --out are required")
			}
			if !quiet {
				opts.Progress = func(s string) { fmt.Fprintln(cmd.ErrOrStderr(), s) }
			}
			if opts.Label == "" {
				opts.Label = label(out)
			}
			cfg, err := rootfs.FromImage(cmd.Context(), from, out, opts)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "built %s from %s (%s)\n", out, from, cfg.Digest)
			for _, kv := range []struct {
				k string
				v []string
			}{{"env", cfg.Env}, {"workdir", nonEmpty(cfg.WorkingDir)}, {"user", nonEmpty(cfg.User)},
				{"entrypoint", cfg.Entrypoint}, {"cmd", cfg.Cmd}} {
				if len(kv.v) > 0 {
					fmt.Fprintf(w, "%-11s %q\n", kv.k+":", kv.v)
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&from, "from-image", "", "the image: registry reference, oci:DIR, docker-archive:FILE")
	f.StringVar(&out, "out", "", "the ext4 image to write (replaced whole when complete)")
	f.IntVar(&opts.SizeMiB, "size-mib", 0, "the file system's size (default: what the files need plus headroom)")
	f.IntVar(&opts.MaxSizeMiB, "max-size-mib", 0, "refuse images needing more than this (default: no limit)")
	f.BoolVar(&opts.Insecure, "insecure", false, "allow plain HTTP to the registry")
	f.StringVar(&opts.Label, "label", "", "the file system's label (default: from --out, like rootfs-NAME)")
	f.BoolVarP(&quiet, "quiet", "q", false, "no progress lines")
	return cmd
}

// label derives a file system label from the output's name, as setup.sh
// labels rootfs-NAME.ext4 "rootfs-NAME"; labels hold 16 bytes.
func label(out string) string {
	l := strings.TrimSuffix(filepath.Base(out), ".ext4")
	if len(l) > 16 {
		l = l[:16]
	}
	return l
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}
