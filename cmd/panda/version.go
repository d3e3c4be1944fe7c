package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/pandastack/pandastack/cmd/panda/internal/cli"
	"github.com/spf13/cobra"
)

// version is set at build time (Makefile: -ldflags '-X main.version=...'
// from `git describe --always --dirty`); "dev" for a plain `go build`.
var version = "dev"

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the versions of panda, Go and the guest agent",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			writeVersion(cmd.Context(), cmd.OutOrStdout(), guestAgentPaths())
			return nil
		},
	}
}

// guestAgentPaths are where a guest agent binary may be, in order: the one
// installed in the images directory (what new guests run), then the one
// built next to this binary (bin/panda-guest).
func guestAgentPaths() []string {
	dir := envOr("PANDA_DATA_DIR", cli.DefaultDataDir)
	paths := []string{filepath.Join(dir, "images", "panda-guest")}
	if exe, err := os.Executable(); err == nil {
		paths = append(paths, filepath.Join(filepath.Dir(exe), "panda-guest"))
	}
	return paths
}

// writeVersion prints panda's version, the Go version and the version of
// the first guest agent binary of guestPaths that answers --version
// ("unknown" when none does).
func writeVersion(ctx context.Context, w io.Writer, guestPaths []string) {
	fmt.Fprintf(w, "panda %s\n", version)
	fmt.Fprintf(w, "go %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	guest, from := "unknown", ""
	for _, p := range guestPaths {
		if v, err := guestAgentVersion(ctx, p); err == nil && v != "" {
			guest, from = v, " ("+p+")"
			break
		}
	}
	fmt.Fprintf(w, "guest agent %s%s\n", guest, from)
}

// guestAgentVersion runs the guest agent binary at path with --version. The
// agent is a static binary, so it runs on the host too.
func guestAgentVersion(ctx context.Context, path string) (string, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if _, err := os.Stat(path); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("run %s --version: %w", path, err)
	}
	return strings.TrimSpace(string(out)), nil
}
