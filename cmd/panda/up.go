package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/internal/server"
	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func upCmd() *cobra.Command {
	cfg := server.Defaults()
	var configFile string
	var defaultTTL, maxTTL time.Duration
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the all-in-one server: REST API, scheduler and the local host agent",
		Long: `Run the all-in-one server in the foreground: REST API on 127.0.0.1:7788,
state in SQLite in the data directory, sandboxes on this host.

On first start it creates an admin API key, prints it once and saves it to
DATA_DIR/admin.key (mode 0600). Stop it with Ctrl-C or SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Precedence: defaults < config file < environment < flags.
			final := server.Defaults()
			if configFile != "" {
				if err := final.LoadFile(configFile); err != nil {
					return err
				}
			}
			if v := os.Getenv("PANDA_DATA_DIR"); v != "" {
				final.DataDir = v
			}
			f := cmd.Flags()
			set := func(name string, apply func()) {
				if f.Changed(name) {
					apply()
				}
			}
			set("listen", func() { final.Listen = cfg.Listen })
			set("data-dir", func() { final.DataDir = cfg.DataDir })
			set("images", func() { final.ImagesDir = cfg.ImagesDir })
			set("catalog", func() { final.Catalog = cfg.Catalog })
			set("accel", func() { final.Accel = cfg.Accel })
			set("default-template", func() { final.DefaultTemplate = cfg.DefaultTemplate })
			set("default-memory", func() { final.DefaultMemoryMiB = cfg.DefaultMemoryMiB })
			set("default-ttl", func() { final.DefaultTTL = server.Duration(defaultTTL) })
			set("max-ttl", func() { final.MaxTTL = server.Duration(maxTTL) })
			set("max-sandboxes-per-key", func() { final.MaxSandboxesPerKey = cfg.MaxSandboxesPerKey })
			set("max-memory-per-key", func() { final.MaxMemoryMiBPerKey = cfg.MaxMemoryMiBPerKey })
			set("on-shutdown", func() { final.OnShutdown = cfg.OnShutdown })
			set("bake", func() { final.BakeOnStart = cfg.BakeOnStart })
			set("log-level", func() { final.LogLevel = cfg.LogLevel })
			set("log-format", func() { final.LogFormat = cfg.LogFormat })
			if final.ImagesDir == "" {
				final.ImagesDir = filepath.Join(final.DataDir, "images")
			}
			if err := final.Validate(); err != nil {
				return fmt.Errorf("config: %w", err)
			}
			log := final.Logger(cmd.ErrOrStderr())
			return server.Run(cmd.Context(), final, version, apispec.OpenAPI, cmd.OutOrStdout(), log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file (see docs/configuration.md)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "address to serve the API on")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data directory (env PANDA_DATA_DIR)")
	f.StringVar(&cfg.ImagesDir, "images", "", "guest images from make setup (default DATA_DIR/images)")
	f.StringVar(&cfg.Catalog, "catalog", "", "catalog: a SQLite file (default DATA_DIR/panda.db) or postgres://...")
	f.StringVar(&cfg.Accel, "accel", cfg.Accel, "auto (probe KVM), kvm or tcg")
	f.StringVar(&cfg.DefaultTemplate, "default-template", cfg.DefaultTemplate, "template of creates that name none")
	f.IntVar(&cfg.DefaultMemoryMiB, "default-memory", cfg.DefaultMemoryMiB, "guest memory (MiB) of creates that give none")
	f.DurationVar(&defaultTTL, "default-ttl", time.Duration(cfg.DefaultTTL), "TTL of creates that give none")
	f.DurationVar(&maxTTL, "max-ttl", time.Duration(cfg.MaxTTL), "longest TTL allowed")
	f.IntVar(&cfg.MaxSandboxesPerKey, "max-sandboxes-per-key", 64, "concurrent sandboxes per API key (keys can override)")
	f.IntVar(&cfg.MaxMemoryMiBPerKey, "max-memory-per-key", 64<<10, "total guest memory (MiB) per API key")
	f.StringVar(&cfg.OnShutdown, "on-shutdown", cfg.OnShutdown, "what SIGTERM does to sandboxes: kill, or keep (adopted at next start)")
	f.BoolVar(&cfg.BakeOnStart, "bake", false, "bake the default template before serving")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "text or json")
	return cmd
}
