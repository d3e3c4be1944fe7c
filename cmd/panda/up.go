package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	apispec "github.com/pandastack/pandastack/api"
	"github.com/pandastack/pandastack/cmd/panda/internal/daemon"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

func upCmd() *cobra.Command {
	return daemonCmd(&cobra.Command{
		Use:   "up",
		Short: "Run the all-in-one server: REST API, scheduler and the local host agent",
		Long: `Run the all-in-one server in the foreground: REST API on 127.0.0.1:7788,
state in SQLite in the data directory, sandboxes on this host.

On first start it creates an admin API key, prints it once and saves it to
DATA_DIR/admin.key (mode 0600). Stop it with Ctrl-C or SIGTERM.`,
	}, daemon.Defaults, flagGroups(hostFlags, controlFlags, []string{"max-template-builds", "template-max-size", "template-context-max", "build-cache-max", "registry-allow-net", "registry-allow-host"}), func(cmd *cobra.Command, cfg daemon.Config, log *slog.Logger) error {
		return daemon.Run(cmd.Context(), cfg, version, apispec.OpenAPI, cmd.OutOrStdout(), log)
	})
}

func serverCmd() *cobra.Command {
	return daemonCmd(&cobra.Command{
		Use:   "server",
		Short: "Run the control plane (REST API, TTLs, catalog) against a host agent",
		Long: `Run the control plane of panda up without a host agent of its own: the REST
API on 127.0.0.1:7788, the catalog (SQLite in the data directory, or
PostgreSQL) and TTL enforcement, with the sandboxes of the panda agent at
--agent. It talks to the agent over TLS, trusting only the agent's own CA
(--agent-ca-file, default DATA_DIR/agent-ca.pem), with the agent's token
(--agent-token-file, default DATA_DIR/agent.token); it waits for the agent
to answer, and reconciles its catalog with the agent's sandboxes before
serving and on every reconnect.

On first start it creates an admin API key, prints it once and saves it to
DATA_DIR/admin.key (mode 0600). Stopping it leaves the sandboxes running on
the agent. See docs/deployment.md.`,
	}, daemon.ServerDefaults, flagGroups(controlFlags, []string{"agent", "agent-token-file", "agent-ca-file", "fleet", "join-token-file", "host-lost-after", "template-host", "template-context-max"}), func(cmd *cobra.Command, cfg daemon.Config, log *slog.Logger) error {
		return daemon.RunServer(cmd.Context(), cfg, version, apispec.OpenAPI, cmd.OutOrStdout(), log)
	})
}

func agentCmd() *cobra.Command {
	return daemonCmd(&cobra.Command{
		Use:   "agent",
		Short: "Run a host agent: this host's sandboxes, behind the host API for panda server",
		Long: `Run the host agent of panda up without the control plane: sandboxes, templates
and snapshots of this host, served to panda server over the internal host
API on 127.0.0.1:7789. It adopts the sandboxes an earlier run left running.

The host API is served over TLS only. On first start the agent makes its
credentials in the data directory: a random token (--token-file, default
DATA_DIR/agent.token, mode 0600) and a CA of its own (agent-ca.pem, to give
to panda server; its key agent-ca-key.pem, mode 0600) that signs its
serving certificate (agent-cert.pem, agent-key.pem) for localhost, this
host's name, the listen address and --tls-host. SIGTERM kills the
running sandboxes (--on-shutdown kill) or leaves them for the next start to
adopt (keep). See docs/deployment.md.`,
	}, daemon.AgentDefaults, flagGroups(hostFlags, []string{"token-file", "tls-host", "server", "token", "host-id", "advertise-url", "host-memory", "host-cpus",
		"max-template-builds", "template-max-size", "build-cache-max", "registry-allow-net", "registry-allow-host"}), func(cmd *cobra.Command, cfg daemon.Config, log *slog.Logger) error {
		return daemon.RunAgent(cmd.Context(), cfg, cmd.OutOrStdout(), log)
	})
}

// The flags of the parts: panda up has both groups; panda agent the host's,
// panda server the control plane's.
var (
	hostFlags = []string{"images", "accel", "default-template", "default-memory", "on-shutdown", "bake",
		"network", "network-prefix", "network-pool", "network-pool-size", "dns-upstream", "allow-host-net", "bake-network", "store", "lazy-restore"}
	controlFlags = []string{"catalog", "default-ttl", "max-ttl", "max-sandboxes-per-key", "max-memory-per-key",
		"max-vcpus-per-key", "max-disk-per-key", "metrics-listen", "public-url", "proxy-domain"}
)

// flagGroups is the flags every daemon has and those of groups.
func flagGroups(groups ...[]string) []string {
	out := []string{"listen", "data-dir", "log-level", "log-format"}
	for _, g := range groups {
		out = append(out, g...)
	}
	return out
}

// configFlag is a flag that sets one field of server.Config.
type configFlag struct {
	usage string
	field func(c *daemon.Config) any // a pointer to the field
}

var configFlags = map[string]configFlag{
	"listen":                {"address to listen on", func(c *daemon.Config) any { return &c.Listen }},
	"data-dir":              {"data directory (env PANDA_DATA_DIR)", func(c *daemon.Config) any { return &c.DataDir }},
	"images":                {"guest images from make setup (default DATA_DIR/images)", func(c *daemon.Config) any { return &c.ImagesDir }},
	"catalog":               {"catalog: a SQLite file (default DATA_DIR/panda.db) or postgres://...", func(c *daemon.Config) any { return &c.Catalog }},
	"accel":                 {"auto (probe KVM), kvm or tcg", func(c *daemon.Config) any { return &c.Accel }},
	"default-template":      {"template of creates that name none", func(c *daemon.Config) any { return &c.DefaultTemplate }},
	"default-memory":        {"guest memory (MiB) of creates that give none", func(c *daemon.Config) any { return &c.DefaultMemoryMiB }},
	"default-ttl":           {"TTL of creates that give none", func(c *daemon.Config) any { return &c.DefaultTTL }},
	"max-ttl":               {"longest TTL allowed", func(c *daemon.Config) any { return &c.MaxTTL }},
	"max-sandboxes-per-key": {"concurrent sandboxes per API key (keys can override)", func(c *daemon.Config) any { return &c.MaxSandboxesPerKey }},
	"max-memory-per-key":    {"total guest memory (MiB) per API key", func(c *daemon.Config) any { return &c.MaxMemoryMiBPerKey }},
	"max-vcpus-per-key":     {"total vCPUs per API key", func(c *daemon.Config) any { return &c.MaxVCPUsPerKey }},
	"max-disk-per-key":      {"disk (MiB) per API key: sandbox disks, paused sandboxes, snapshots, volumes", func(c *daemon.Config) any { return &c.MaxDiskMiBPerKey }},
	"max-volumes-per-key":   {"volumes per API key", func(c *daemon.Config) any { return &c.MaxVolumesPerKey }},
	"metrics-listen":        {"serve /metrics without a key on this address too (e.g. 127.0.0.1:9788)", func(c *daemon.Config) any { return &c.MetricsListen }},
	"public-url":            {"the API's base URL as clients reach it, in signed port URLs (default: from each request)", func(c *daemon.Config) any { return &c.PublicURL }},
	"proxy-domain":          {"also serve sandbox ports at PORT-ID.DOMAIN (wildcard DNS and TLS in front)", func(c *daemon.Config) any { return &c.ProxyDomain }},
	"network":               {"on: every sandbox gets a network with NAT, DNS and its egress policy; off: none (docs/networking.md)", func(c *daemon.Config) any { return &c.Network }},
	"network-prefix":        {"name prefix of this host's network namespaces, veths and nftables table", func(c *daemon.Config) any { return &c.NetworkPrefix }},
	"network-pool":          {"IPv4 range of the sandboxes' veth pairs, a /30 each (default 10.234.0.0/16)", func(c *daemon.Config) any { return &c.NetworkPool }},
	"network-pool-size":     {"network namespaces kept prepared (default 4; negative: none)", func(c *daemon.Config) any { return &c.NetworkPoolSize }},
	"dns-upstream":          {"resolver the sandboxes' DNS goes to, ip or ip:port (repeatable; default: the host's, from /etc/resolv.conf or systemd-resolved's upstreams)", func(c *daemon.Config) any { return &c.DNSUpstreams }},
	"allow-host-net":        {"a CIDR of the host's or private networks sandboxes may reach after all (repeatable)", func(c *daemon.Config) any { return &c.AllowedHostNets }},
	"bake-network":          {"let template bakes reach the network (default policy), for set-ups that install packages", func(c *daemon.Config) any { return &c.BakeNetwork }},
	"store":                 {"object store keeping snapshots durable: DIR, file:///DIR or s3://BUCKET/PREFIX?endpoint=HOST:PORT (credentials from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; docs/storage.md); default none", func(c *daemon.Config) any { return &c.Store }},
	"lazy-restore":          {"with --store: restore snapshots and paused sandboxes this host does not hold with their memory paged in on first touch (experimental; docs/lazy-restore.md)", func(c *daemon.Config) any { return &c.LazyRestore }},
	"on-shutdown":           {"what SIGTERM does to sandboxes: kill, or keep (adopted at next start)", func(c *daemon.Config) any { return &c.OnShutdown }},
	"max-template-builds":   {"template builds from images running at once (more queue)", func(c *daemon.Config) any { return &c.MaxTemplateBuilds }},
	"template-max-size":     {"largest root filesystem (MiB) of a template built from an image (0: no cap)", func(c *daemon.Config) any { return &c.TemplateMaxSizeMiB }},
	"template-context-max":  {"largest build context (MiB) a Dockerfile build may upload", func(c *daemon.Config) any { return &c.TemplateContextMaxMiB }},
	"build-cache-max":       {"largest size (MiB) of the layers Dockerfile builds keep for later builds", func(c *daemon.Config) any { return &c.BuildCacheMaxMiB }},
	"max-templates-per-key": {"templates a key other than an admin one may own (-1: no bound)", func(c *daemon.Config) any { return &c.MaxTemplatesPerKey }},
	"registry-allow-net":    {"a CIDR (or address) template builds may pull images from although it is private, loopback or the host's (repeatable)", func(c *daemon.Config) any { return &c.RegistryAllowNets }},
	"registry-allow-host":   {"a registry host name (HOST or HOST:PORT) template builds may pull from wherever it resolves (repeatable)", func(c *daemon.Config) any { return &c.RegistryAllowHosts }},
	"bake":                  {"bake the default template before serving", func(c *daemon.Config) any { return &c.BakeOnStart }},
	"agent":                 {"URL of the host agent (panda agent): https://HOST:PORT", func(c *daemon.Config) any { return &c.AgentURL }},
	"agent-token-file":      {"file holding the agent token (default DATA_DIR/agent.token)", func(c *daemon.Config) any { return &c.AgentTokenFile }},
	"agent-ca-file":         {"the agent's CA certificate, the only one trusted for it (default DATA_DIR/agent-ca.pem)", func(c *daemon.Config) any { return &c.AgentCAFile }},
	"fleet":                 {"drive the host agents that join (panda agent --server URL --token T) instead of --agent", func(c *daemon.Config) any { return &c.Fleet }},
	"join-token-file":       {"file holding the token host agents join with (default DATA_DIR/join.token, made on first start)", func(c *daemon.Config) any { return &c.JoinTokenFile }},
	"host-lost-after":       {"a host that misses heartbeats this long is lost (default 10s)", func(c *daemon.Config) any { return &c.HostLostAfter }},
	"template-host":         {"with --fleet: the host (its id) that runs every build of the fleet's user templates (default: the ready host with the most free memory)", func(c *daemon.Config) any { return &c.TemplateHost }},
	"server":                {"join the control plane at this URL (panda server --fleet), e.g. http://10.0.0.1:7788", func(c *daemon.Config) any { return &c.ServerURL }},
	"token":                 {"the join token (the server's DATA_DIR/join.token); env PANDA_JOIN_TOKEN", func(c *daemon.Config) any { return &c.JoinToken }},
	"host-id":               {"this host's name in the fleet (default DATA_DIR/host.id, made from the host name)", func(c *daemon.Config) any { return &c.HostID }},
	"host-cpus":             {"CPUs this host offers the fleet, if fewer than the machine's: its capacity, which the scheduler counts vCPUs against", func(c *daemon.Config) any { return &c.HostCPUs }},
	"host-memory":           {"memory (MiB) this host offers the fleet, if less than the machine's: its capacity, and the most free memory it reports", func(c *daemon.Config) any { return &c.HostMemoryMiB }},
	"advertise-url":         {"the host API's URL as the control plane reaches it (default https://LISTEN)", func(c *daemon.Config) any { return &c.AdvertiseURL }},
	"tls-host":              {"another host name or address for the agent's certificate (repeatable)", func(c *daemon.Config) any { return &c.TLSHosts }},
	"token-file":            {"file holding the agent token, created on first start (default DATA_DIR/agent.token)", func(c *daemon.Config) any { return &c.AgentTokenFile }},
	"log-level":             {"debug, info, warn or error (default: warn when standard error is a terminal, else info)", func(c *daemon.Config) any { return &c.LogLevel }},
	"log-format":            {"text or json", func(c *daemon.Config) any { return &c.LogFormat }},
}

// daemonCmd completes cmd into a daemon command with the named flags and
// --config. Its configuration comes from defaults < config file <
// environment < flags.
func daemonCmd(cmd *cobra.Command, defaults func() daemon.Config, flags []string,
	run func(cmd *cobra.Command, cfg daemon.Config, log *slog.Logger) error) *cobra.Command {
	var configFile string
	set := defaults() // what the flags parse into
	set.LogLevel = "" // the flag's default depends on the terminal: logLevel
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file (see docs/configuration.md)")
	for _, name := range flags {
		addConfigFlag(f, name, configFlags[name].usage, configFlags[name].field(&set))
	}
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cfg := defaults()
		cfg.LogLevel = "" // unless the file or a flag sets it: logLevel
		if configFile != "" {
			if err := cfg.LoadFile(configFile); err != nil {
				return err
			}
		}
		if v := os.Getenv("PANDA_JOIN_TOKEN"); v != "" {
			cfg.JoinToken = v
		}
		if v := os.Getenv("PANDA_DATA_DIR"); v != "" {
			cfg.DataDir = v
		}
		for _, name := range flags {
			if f.Changed(name) {
				field := configFlags[name].field
				copyField(field(&cfg), field(&set))
			}
		}
		cfg.StoreCredentials = objstore.EnvCredentials(os.Getenv)
		// This binary is the holder process of lazy restore's mount
		// (main calls lazymem.HolderMain first).
		if exe, err := os.Executable(); err == nil {
			cfg.LazyHolder = exe
		}
		if cfg.ImagesDir == "" {
			cfg.ImagesDir = filepath.Join(cfg.DataDir, "images")
		}
		if cfg.LogLevel == "" {
			cfg.LogLevel = logLevel(cmd.ErrOrStderr())
		}
		if err := cfg.Validate(); err != nil {
			return fmt.Errorf("config: %w", err)
		}
		// Daemons keep tenants' data: what they create is theirs alone
		// unless they widen it on purpose.
		syscall.Umask(0o077)
		return run(cmd, cfg, cfg.Logger(cmd.ErrOrStderr()))
	}
	return cmd
}

// logLevel is the log level of a daemon that was given none: warn when
// its logs go to a terminal, where a person runs it (panda up in a shell:
// what it prints on stdout — the admin key, the bake's steps, the address
// it listens on — must not drown in the info lines), else info (a service
// manager's journal, a file, a test).
func logLevel(stderr io.Writer) string {
	if f, ok := stderr.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			return "warn"
		}
	}
	return "info"
}

func addConfigFlag(f *pflag.FlagSet, name, usage string, p any) {
	switch p := p.(type) {
	case *string:
		f.StringVar(p, name, *p, usage)
	case *int:
		f.IntVar(p, name, *p, usage)
	case *bool:
		f.BoolVar(p, name, *p, usage)
	case *daemon.Duration:
		f.DurationVar((*time.Duration)(p), name, time.Duration(*p), usage)
	case *[]string:
		f.StringArrayVar(p, name, *p, usage)
	default:
		panic(fmt.Sprintf("flag %s: unsupported type %T", name, p))
	}
}

// copyField sets *dst to *src; both point to fields of one type.
func copyField(dst, src any) {
	switch d := dst.(type) {
	case *string:
		*d = *src.(*string)
	case *int:
		*d = *src.(*int)
	case *bool:
		*d = *src.(*bool)
	case *daemon.Duration:
		*d = *src.(*daemon.Duration)
	case *[]string:
		*d = *src.(*[]string)
	}
}
