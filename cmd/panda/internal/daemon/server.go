// Package server wires PandaStack's daemons: the all-in-one server
// (`panda up`: the host agent, the catalog, the REST API and the TTL loop),
// and the same parts run separately, the control plane (`panda server`,
// RunServer) and a host agent behind its host API (`panda agent`,
// RunAgent). Each starts its parts in order and shuts them down in reverse
// order. It owns their configuration.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/opencatalog"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"
)

// Config is the server's configuration (YAML file and flags).
type Config struct {
	Listen    string `yaml:"listen"`
	DataDir   string `yaml:"data_dir"`
	ImagesDir string `yaml:"images_dir"`
	// Catalog is "" (SQLite in the data directory), a SQLite path, or a
	// postgres:// URL.
	Catalog string `yaml:"catalog"`
	Accel   string `yaml:"accel"`
	QEMU    string `yaml:"qemu"`

	DefaultTemplate  string `yaml:"default_template"`
	DefaultMemoryMiB int    `yaml:"default_memory_mib"`
	DefaultVCPUs     int    `yaml:"default_vcpus"`

	DefaultTTL         Duration `yaml:"default_ttl"`
	MaxTTL             Duration `yaml:"max_ttl"`
	MaxSandboxesPerKey int      `yaml:"max_sandboxes_per_key"`
	MaxMemoryMiBPerKey int      `yaml:"max_memory_mib_per_key"`
	MaxVCPUsPerKey     int      `yaml:"max_vcpus_per_key"`
	MaxDiskMiBPerKey   int      `yaml:"max_disk_mib_per_key"`
	MaxVolumesPerKey   int      `yaml:"max_volumes_per_key"`
	MaxUploadBytes     int64    `yaml:"max_upload_bytes"`

	// OnShutdown is what SIGTERM does to running sandboxes: "kill" (the
	// default: nothing is left running) or "keep" (they keep running and
	// the next start adopts them).
	OnShutdown string `yaml:"on_shutdown"`
	// BakeOnStart bakes the default template before serving.
	BakeOnStart bool `yaml:"bake_on_start"`
	// MetricsListen, if set, serves /metrics there without authentication
	// (e.g. 127.0.0.1:9788 for a local Prometheus); the API's own /metrics
	// needs an admin key either way.
	MetricsListen string `yaml:"metrics_listen"`

	// PublicURL is the API's base URL as clients reach it, for signed port
	// URLs (default: the scheme and host of each request).
	PublicURL string `yaml:"public_url"`
	// ProxyDomain, if set, also serves sandbox ports at
	// {port}-{id}.{ProxyDomain} (a wildcard DNS record and certificate in
	// front: docs/deployment.md).
	ProxyDomain string `yaml:"proxy_domain"`

	// Network is "on" (the default: every sandbox gets a network namespace
	// of its own joined to this host, with NAT, DNS and its egress policy;
	// ports are reachable through the API) or "off" (guests reach their
	// gateway and nothing else; no port proxy). See docs/networking.md.
	Network string `yaml:"network"`
	// NetworkPrefix names this host's namespaces, veths and nftables
	// table (default "panda"; one per host and data directory).
	NetworkPrefix string `yaml:"network_prefix"`
	// NetworkPool is the IPv4 range the host side of each sandbox's veth
	// pair is taken from, a /30 each (default 10.234.0.0/16). Sandboxes
	// can never reach it.
	NetworkPool string `yaml:"network_pool"`
	// NetworkPoolSize is how many namespaces are kept prepared (default
	// 4; negative: none).
	NetworkPoolSize int `yaml:"network_pool_size"`
	// DNSUpstreams are the resolvers ("ip" or "ip:port") the sandboxes'
	// DNS forwarders ask (default: the host's, see
	// network.Config.Upstreams).
	DNSUpstreams []string `yaml:"dns_upstreams"`
	// AllowedHostNets are CIDRs of the host's own or private networks that
	// sandboxes may reach after all (always blocked otherwise: the host,
	// other sandboxes, link-local, the host's private networks).
	AllowedHostNets []string `yaml:"allowed_host_nets"`
	// BakeNetwork lets template bakes reach the network (under the
	// default policy: internet on, the always-blocked ranges blocked), for
	// set-ups that install packages. Default off: bakes are isolated.
	BakeNetwork bool `yaml:"bake_network"`

	// Store is the object store where the host agent keeps snapshots
	// durable (uploaded in the background after each snapshot; fetched
	// again when the host lost them): a directory, file:///dir or
	// s3://bucket/prefix?endpoint=host:port (docs/storage.md). Default
	// "": none, snapshots live only on this host's disk.
	Store string `yaml:"store"`
	// StoreCredentials sign requests to an s3:// store; cmd/panda reads
	// them from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
	// AWS_SESSION_TOKEN, never from the file.
	StoreCredentials objstore.Credentials `yaml:"-"`
	// LazyRestore, with Store, restores snapshots and paused sandboxes this
	// host does not hold with their memory paged in on first touch through
	// a FUSE file and a chunk cache in DATA_DIR/store/chunk-cache, instead of
	// downloading the memory image first (docs/lazy-restore.md).
	// Experimental; default off.
	LazyRestore bool `yaml:"lazy_restore"`
	// LazyHolder is the executable of lazy restore's holder process
	// (agent.LazyConfig.Holder): cmd/panda sets it to itself. Empty: the
	// agent serves the mount itself, and its lazily restored machines die
	// with it.
	LazyHolder string `yaml:"-"`

	// MaxTemplateBuilds bounds the builds of templates from images
	// (POST /v1/templates) running at once; more queue (default 2).
	MaxTemplateBuilds int `yaml:"max_template_builds"`
	// TemplateMaxSizeMiB caps the root filesystem of a template built
	// from an image (default 16384; 0: no cap).
	TemplateMaxSizeMiB int `yaml:"template_max_size_mib"`
	// TemplateContextMaxMiB bounds the build context a Dockerfile build
	// uploads (default 2048); TemplateContextDir is where contexts are
	// received before their build takes them (default
	// DATA_DIR/build-contexts, emptied at start).
	TemplateContextMaxMiB int    `yaml:"template_context_max_mib"`
	TemplateContextDir    string `yaml:"template_context_dir"`
	// BuildCacheMaxMiB bounds the layers of Dockerfile builds kept in
	// STORE/build-cache (the data directory's reflink store) for later
	// builds to reuse (default 51200; over it, the least recently used
	// layer of the key holding the most goes first).
	BuildCacheMaxMiB int `yaml:"build_cache_max_mib"`
	// MaxTemplatesPerKey bounds the templates a key other than an admin
	// one may own (default 20; -1: no bound).
	MaxTemplatesPerKey int `yaml:"max_templates_per_key"`
	// RegistryAllowNets are CIDRs (or addresses) that template builds may
	// pull images from although they are refused by default (loopback,
	// link-local, private, shared, multicast, reserved and the host's own
	// subnets): the operator's own registries. RegistryAllowHosts are
	// registry names ("registry.internal" or "registry.internal:5000")
	// whose connections are not checked at all. Pulls are anonymous
	// either way (rootfs.Pull).
	RegistryAllowNets  []string `yaml:"registry_allow_nets"`
	RegistryAllowHosts []string `yaml:"registry_allow_hosts"`
	// MaxTemplateBuildsPerKey bounds the template builds a key other than
	// an admin one has queued, running or being uploaded at once (default
	// 2; -1: no bound); MaxTemplateVersions the versions one of its
	// templates keeps (default 10; -1: no bound). See api.Config.
	MaxTemplateBuildsPerKey int `yaml:"max_template_builds_per_key"`
	MaxTemplateVersions     int `yaml:"max_template_versions"`
	// MaxEventStreamsPerKey bounds the event streams (GET /v1/events) one
	// key has open at once (default 8; -1: no bound).
	MaxEventStreamsPerKey int `yaml:"max_event_streams_per_key"`

	// AgentURL is the host agent's API that `panda server` drives
	// (https://host:7789); `panda up` and `panda agent` ignore it.
	AgentURL string `yaml:"agent_url"`
	// AgentTokenFile holds the agent token: `panda agent` reads it, or
	// creates it on first start; `panda server` reads it (default
	// DATA_DIR/agent.token for both).
	AgentTokenFile string `yaml:"agent_token_file"`
	// AgentCAFile is the CA certificate `panda server` trusts for the
	// agent (default DATA_DIR/agent-ca.pem, where `panda agent` makes it).
	AgentCAFile string `yaml:"agent_ca_file"`
	// Fleet: `panda server` drives the host agents that join it
	// (`panda agent --server URL --token T`) instead of the one at
	// AgentURL. JoinTokenFile holds the token agents join with (default
	// DATA_DIR/join.token, made on first start); HostLostAfter is how long
	// a host may miss heartbeats before it is lost (default 10s).
	Fleet         bool     `yaml:"fleet"`
	JoinTokenFile string   `yaml:"join_token_file"`
	HostLostAfter Duration `yaml:"host_lost_after"`
	// TemplateHost, if set, is the host of a fleet that runs every build
	// of its user templates ("": the ready host with the most free memory;
	// see fleet.Templates). Their registry is the catalog's either way.
	TemplateHost string `yaml:"template_host"`
	// ServerURL: `panda agent` joins the control plane there (its REST
	// API, http(s)://HOST:PORT) with JoinToken, as host HostID (default:
	// DATA_DIR/host.id, made on first start from this host's name),
	// reachable at AdvertiseURL (default https:// + the listen address;
	// required when listening on every address).
	ServerURL    string `yaml:"server"`
	JoinToken    string `yaml:"join_token"`
	HostID       string `yaml:"host_id"`
	AdvertiseURL string `yaml:"advertise_url"`
	// HostMemoryMiB is the memory (MiB) `panda agent` offers the fleet
	// when less than the machine's (0): its capacity, and the most free
	// memory it reports — that less what its machines hold. For agents
	// that share a machine (panda dev cluster) or a machine that keeps
	// memory for other work.
	HostMemoryMiB int `yaml:"host_memory_mib"`
	// HostCPUs is the CPUs `panda agent` offers the fleet when fewer than
	// the machine's (0): its capacity, which the scheduler's vCPU bound
	// and balance count. For agents that share a machine.
	HostCPUs int `yaml:"host_cpus"`
	// TLSHosts are more host names and addresses for the certificate of
	// `panda agent` (besides localhost, the listen address, this host's
	// name, and every address of this host when listening on all).
	TLSHosts []string `yaml:"tls_hosts"`

	// HTTP timeouts of the REST API and the host API (0: none); see
	// serveOptions.
	HTTPReadHeaderTimeout Duration `yaml:"http_read_header_timeout"`
	HTTPIdleTimeout       Duration `yaml:"http_idle_timeout"`
	HTTPBodyReadTimeout   Duration `yaml:"http_body_read_timeout"`

	LogLevel  string `yaml:"log_level"`
	LogFormat string `yaml:"log_format"`
}

// Duration is a time.Duration read from YAML as "5m", "24h".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("duration %q: %w", n.Value, err)
	}
	*d = Duration(v)
	return nil
}

// Defaults returns the configuration `panda up` runs with when nothing is
// set.
func Defaults() Config {
	return Config{
		Listen:           "127.0.0.1:7788",
		DataDir:          "/var/lib/pandastack",
		Accel:            "auto",
		DefaultTemplate:  "base",
		DefaultMemoryMiB: 1024,
		DefaultVCPUs:     1,
		DefaultTTL:       Duration(5 * time.Minute),
		MaxTTL:           Duration(24 * time.Hour),
		// The API's own defaults, spelled out for --help.
		MaxSandboxesPerKey: 64,
		MaxMemoryMiBPerKey: 64 << 10,
		MaxVCPUsPerKey:     128,
		MaxDiskMiBPerKey:   1 << 20,
		MaxVolumesPerKey:   controlplane.DefaultMaxVolumesPerKey,
		OnShutdown:         "kill",
		Network:            "on",
		MaxTemplateBuilds:  build.DefaultMaxConcurrent,
		TemplateMaxSizeMiB: 16 << 10,
		// api.DefaultTemplateContextMaxBytes
		TemplateContextMaxMiB: 2 << 10,
		BuildCacheMaxMiB:      50 << 10,
		MaxTemplatesPerKey:    controlplane.DefaultMaxTemplatesPerKey,
		LogLevel:              "info",
		LogFormat:             "text",

		// The control plane's and the API's defaults, spelled out.
		MaxTemplateBuildsPerKey: controlplane.DefaultMaxTemplateBuildsPerKey,
		MaxTemplateVersions:     controlplane.DefaultMaxTemplateVersions,
		MaxEventStreamsPerKey:   rest.DefaultMaxEventStreamsPerKey,

		HTTPReadHeaderTimeout: Duration(10 * time.Second),
		HTTPIdleTimeout:       Duration(2 * time.Minute),
		HTTPBodyReadTimeout:   Duration(time.Minute),
	}
}

// LoadFile merges a YAML file over c. Unknown keys are errors.
func (c *Config) LoadFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("parse config %s: %w", path, err)
	}
	return nil
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("data_dir is required")
	}
	if c.LazyRestore && c.Store == "" {
		return errors.New("lazy_restore needs a store")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen %q: %w", c.Listen, err)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			return fmt.Errorf("metrics_listen %q: %w", c.MetricsListen, err)
		}
	}
	switch accel.Accel(c.Accel) {
	case accel.Auto, accel.KVM, accel.TCG:
	default:
		return fmt.Errorf("accel %q must be auto, kvm or tcg", c.Accel)
	}
	if _, err := c.networkConfig(nil); err != nil {
		return err
	}
	if c.HostMemoryMiB < 0 {
		return fmt.Errorf("host memory %d MiB: must not be negative (0: the machine's)", c.HostMemoryMiB)
	}
	if c.HostCPUs < 0 {
		return fmt.Errorf("host CPUs %d: must not be negative (0: the machine's)", c.HostCPUs)
	}
	if c.MaxTemplateBuilds < 0 || c.TemplateMaxSizeMiB < 0 {
		return errors.New("max_template_builds and template_max_size_mib must not be negative")
	}
	if c.BuildCacheMaxMiB < 0 {
		return errors.New("build_cache_max_mib must not be negative")
	}
	if c.TemplateContextMaxMiB < 0 {
		return errors.New("template_context_max_mib must not be negative (0: the default, 2048)")
	}
	if c.MaxTemplatesPerKey < -1 {
		return errors.New("max_templates_per_key must be -1 (no bound) or more")
	}
	if _, err := c.registryPull(); err != nil {
		return err
	}
	if c.MaxTemplateBuildsPerKey < -1 || c.MaxTemplateVersions < -1 || c.MaxEventStreamsPerKey < -1 {
		return errors.New("max_template_builds_per_key, max_template_versions and max_event_streams_per_key must be -1 (no bound) or more")
	}
	switch c.OnShutdown {
	case "kill", "keep":
	default:
		return fmt.Errorf("on_shutdown %q must be kill or keep", c.OnShutdown)
	}
	switch c.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("log_format %q must be text or json", c.LogFormat)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return fmt.Errorf("log_level %q must be debug, info, warn or error", c.LogLevel)
	}
	for _, t := range []struct {
		key string
		d   Duration
	}{{"http_read_header_timeout", c.HTTPReadHeaderTimeout}, {"http_idle_timeout", c.HTTPIdleTimeout}, {"http_body_read_timeout", c.HTTPBodyReadTimeout}} {
		if t.d < 0 {
			return fmt.Errorf("%s %v must not be negative (0 turns it off)", t.key, time.Duration(t.d))
		}
	}
	return nil
}

// Logger builds the configured logger.
func (c *Config) Logger(w io.Writer) *slog.Logger {
	var lvl slog.Level
	lvl.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// AdminKeyFile is where the first start writes the admin key.
func AdminKeyFile(dataDir string) string { return filepath.Join(dataDir, "admin.key") }

// Run runs the all-in-one server until ctx ends (SIGINT/SIGTERM), then
// shuts down in reverse order of start. out receives the one-time admin
// key and the listening address.
func Run(ctx context.Context, cfg Config, version string, openapi []byte, out io.Writer, log *slog.Logger) error {
	// 1. One server per data directory: it holds both the host's lock
	// and the control plane's.
	ln, release, err := prepare(cfg, lockHost, lockControl)
	if err != nil {
		return err
	}
	defer release()

	// 2. Host agent: volume, accelerator, templates.
	host, nw, exits, err := openHost(ctx, cfg, log)
	if err != nil {
		return err
	}
	keepRunning := false
	defer func() { closeHost(host, nw, keepRunning, log) }()

	// Template builds, before the API that starts them: closed after it
	// (cancelling the builds in flight), before the host.
	builds, err := openTemplateBuilds(cfg, host, log)
	if err != nil {
		return err
	}
	defer builds.Close()

	// 3. Catalog, admin key, control plane, API; reconcile the catalog
	// with what survived a restart.
	cp, srv, cat, err := openControlPlane(ctx, cfg, hostagent.Local(host), builds, version, openapi, out, log)
	if err != nil {
		return err
	}
	defer cat.Close()
	exits.set(cp.SandboxExited)
	recovered := host.Recover(ctx)
	// Until it serves, a start that fails leaves the sandboxes it adopted
	// running for the next start to adopt: they are not its to kill.
	keepRunning = true
	adopted := adoptedIDs(recovered)
	if err := cp.Reconcile(ctx, adopted); err != nil {
		return err
	}
	if n := len(recovered); n > 0 {
		log.Info("recovered sandboxes from the previous run", "found", n, "adopted", len(adopted))
	}
	if err := bakeOnStart(ctx, cfg, host, out); err != nil {
		return err
	}

	// 4. Serve. From here on, shutdown follows cfg.OnShutdown.
	keepRunning = false
	sv := startServing(ln, srv.Handler(), cfg.serveOptions(log), cp.Run)
	sv.hs.RegisterOnShutdown(srv.CloseStreams) // event streams would hold Shutdown
	if cfg.MetricsListen != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsListen, cfg.serveOptions(log).httpServer(srv.MetricsHandler()), log)
		if err != nil {
			sv.stop()
			return err
		}
		defer stopMetrics()
	}
	fmt.Fprintf(out, "PandaStack listening on http://%s (accel %s, data %s)\n", ln.Addr(), host.Accel(), cfg.DataDir)
	log.Info("serving", "addr", ln.Addr().String())
	if err := sv.wait(ctx); err != nil {
		return err
	}
	// Shutdown, in reverse: stop taking requests, stop the TTL loop, then
	// the sandboxes, (deferred) the catalog and the volume.
	log.Info("shutting down", "on_shutdown", cfg.OnShutdown)
	sv.stop()
	// Operations in flight (pause, resume, snapshot, fork) are cancelled
	// and roll back on the host: nothing is left half done.
	srv.Shutdown()
	octx, ocancel := context.WithTimeout(context.Background(), 30*time.Second)
	cp.Shutdown(octx)
	ocancel()
	if cfg.OnShutdown == "keep" {
		keepRunning = true
		return nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopRunning(host, func(id string) error { return cp.StopForShutdown(sctx, id) }, log)
	return nil
}

// stopRunning calls stop for each sandbox of host that has a VMM: paused
// sandboxes live on disk and survive the restart.
func stopRunning(host *hostagent.Agent, stop func(id string) error, log *slog.Logger) {
	for _, info := range host.List() {
		if info.State == hostagent.StatePaused {
			continue
		}
		if err := stop(info.ID); err != nil {
			log.Error("stop sandbox at shutdown", "sandbox_id", info.ID, "err", err)
		}
	}
}

// Lock files in the data directory: the host's (store, VMMs: panda up
// and panda agent) and the control plane's (catalog, admin key: panda up
// and panda server), so that panda server and panda agent can share one
// data directory.
const (
	lockHost    = "panda.lock"
	lockControl = "server.lock"
)

// prepare validates cfg, creates and locks the data directory and
// listens: a start that cannot serve (the port is taken) must fail before
// it adopts, and so owns, the sandboxes an earlier run left running.
// release undoes it.
func prepare(cfg Config, locks ...string) (ln net.Listener, release func(), err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, fmt.Errorf("config: %w", err)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("cannot create data directory: %w", err)
	}
	// The data directory holds tenants' data (environments in sandbox
	// records and the catalog, disks, memory images): root's alone. Files
	// the daemons create are 0600 and directories 0700 unless made wider
	// on purpose (the umask is the process's, set by cmd/panda).
	if err := os.Chmod(cfg.DataDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("cannot restrict the data directory: %w", err)
	}
	var held []*dirLock
	release = func() {
		if ln != nil {
			ln.Close()
		}
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Close()
		}
	}
	for _, name := range locks {
		l, err := lockDataDir(cfg.DataDir, name)
		if err != nil {
			release()
			return nil, nil, err
		}
		held = append(held, l)
	}
	ln, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		release()
		return nil, nil, fmt.Errorf("cannot listen: %w", err)
	}
	return ln, release, nil
}

// openHost opens the host agent of cfg and, with networking on, its
// network manager (nw, nil when off). Its VMM exits go to exits, which
// forwards them once told where (the consumer is built after the agent).
func openHost(ctx context.Context, cfg Config, log *slog.Logger) (host *hostagent.Agent, nw *hostNetwork, exits *exitRelay, err error) {
	exits = &exitRelay{}
	if nw, err = openNetwork(cfg, log.With("part", "network")); err != nil {
		return nil, nil, nil, err
	}
	var store *chunkstore.Store
	var lazy *hostagent.LazyConfig
	if cfg.Store != "" {
		objs, err := objstore.Open(cfg.Store, cfg.StoreCredentials)
		if err == nil {
			store, lazy, err = openChunkStore(cfg, objs) // lazy.go
		}
		if err != nil {
			nw.close(false)
			return nil, nil, nil, fmt.Errorf("cannot start host agent: object store: %w", err)
		}
	}
	drv, err := qemu.New(qemu.Config{Binary: cfg.QEMU, Logger: log.With("part", "agent")})
	if err != nil {
		nw.close(false)
		return nil, nil, nil, fmt.Errorf("cannot start host agent: open host agent: %w", err)
	}
	acfg := hostagent.Config{
		DataDir: cfg.DataDir, ImagesDir: cfg.ImagesDir, Accel: accel.Accel(cfg.Accel), Driver: drv,
		DefaultTemplate: cfg.DefaultTemplate, DefaultMemoryMiB: cfg.DefaultMemoryMiB, DefaultVCPUs: cfg.DefaultVCPUs,
		AdoptMount: true,
		Store:      store,
		Lazy:       lazy,
		OnExit:     exits.exited,
		Logger:     log.With("part", "agent"),
	}
	if nw != nil {
		acfg.Network = nw.m
		if cfg.BakeNetwork {
			p := netpolicy.Default()
			acfg.BakeNetwork = &p
		}
	}
	host, err = hostagent.Open(ctx, acfg)
	if err != nil {
		nw.close(false)
		return nil, nil, nil, fmt.Errorf("cannot start host agent: %w", err)
	}
	return host, nw, exits, nil
}

// exitRelay is a host agent's OnExit: it forwards to the function set last
// (none: the exit is dropped; nothing runs yet to be told).
type exitRelay struct {
	mu sync.Mutex
	to func(id string, err error)
}

func (r *exitRelay) set(to func(id string, err error)) {
	r.mu.Lock()
	r.to = to
	r.mu.Unlock()
}

func (r *exitRelay) exited(id string, err error) {
	r.mu.Lock()
	to := r.to
	r.mu.Unlock()
	if to != nil {
		to(id, err)
	}
}

// lazyPauseWait bounds the pauses of lazily restored sandboxes at a
// shutdown that keeps the others running (each copies its whole memory
// image, fetching what the host still lacks from the object store).
const lazyPauseWait = 2 * time.Minute

// closeHost closes the host agent, or with keep, leaves its VMMs running
// for the next start to adopt. No VMM running: nothing to keep, so the
// store is unmounted too (paused sandboxes live on disk either way).
func closeHost(host *hostagent.Agent, nw *hostNetwork, keep bool, log *slog.Logger) {
	if keep {
		// A lazily restored machine served by this process (no holder
		// process: LazyHolder unset) dies with it: paused, it waits on
		// disk for the next start. With a holder this pauses nothing.
		ctx, cancel := context.WithTimeout(context.Background(), lazyPauseWait)
		host.PauseLazy(ctx)
		cancel()
	}
	if keep && vmmsRunning(host) {
		host.Detach()
		nw.close(true)
		log.Info("left sandboxes running for the next start to adopt")
		return
	}
	if err := host.Close(); err != nil {
		log.Error("close host agent", "err", err)
	}
	nw.close(false)
}

// bakeOnStart bakes the default template if cfg asks for it.
func bakeOnStart(ctx context.Context, cfg Config, host *hostagent.Agent, out io.Writer) error {
	if !cfg.BakeOnStart {
		return nil
	}
	p := host.TemplateParams("", 0, 0)
	if _, err := host.Templates().Get(ctx, p, func(m string) { fmt.Fprintln(out, "  "+m) }); err != nil {
		return fmt.Errorf("bake default template: %w", err)
	}
	return nil
}

// openControlPlane opens the catalog, creates the admin key on first
// start, and builds the control plane over h and the API over both. The
// caller closes the catalog.
func openControlPlane(ctx context.Context, cfg Config, h host.Host, builds rest.TemplateBuilds, version string, openapi []byte, out io.Writer, log *slog.Logger) (*controlplane.Plane, *rest.Server, catalog.Catalog, error) {
	return openControlPlaneOf(ctx, cfg, func(catalog.Catalog) (host.Host, rest.Fleet, rest.TemplateBuilds) { return h, nil, builds }, version, openapi, out, log)
}

// openControlPlaneOf is openControlPlane with the host, the template
// builds (and the fleet, if hosts join) made from the catalog.
func openControlPlaneOf(ctx context.Context, cfg Config, hostOf func(catalog.Catalog) (host.Host, rest.Fleet, rest.TemplateBuilds), version string, openapi []byte, out io.Writer, log *slog.Logger) (*controlplane.Plane, *rest.Server, catalog.Catalog, error) {
	catURL := cfg.Catalog
	if catURL == "" {
		catURL = filepath.Join(cfg.DataDir, "panda.db")
	}
	cat, err := opencatalog.Open(ctx, catURL)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("cannot open catalog: %w", err)
	}
	fail := func(err error) (*controlplane.Plane, *rest.Server, catalog.Catalog, error) {
		cat.Close()
		return nil, nil, nil, err
	}
	if err := bootstrapAdmin(ctx, cat, cfg.DataDir, out, log); err != nil {
		return fail(err)
	}
	// The secret of signed port URLs: made on first start, kept so that
	// URLs outlive restarts.
	secret, err := rest.LoadOrCreateURLSecret(filepath.Join(cfg.DataDir, rest.URLSecretFile))
	if err != nil {
		return fail(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	h, fl, builds := hostOf(cat)
	// The control plane: the API's handlers, E2B's and the daemon's
	// loops (TTLs, reconciling, host events) all drive this one.
	pcfg := controlplane.Config{
		DefaultTTL: time.Duration(cfg.DefaultTTL), MaxTTL: time.Duration(cfg.MaxTTL),
		MaxSandboxesPerKey: cfg.MaxSandboxesPerKey, MaxMemoryMiBPerKey: cfg.MaxMemoryMiBPerKey,
		MaxVCPUsPerKey: cfg.MaxVCPUsPerKey, MaxDiskMiBPerKey: cfg.MaxDiskMiBPerKey,
		MaxVolumesPerKey:   cfg.MaxVolumesPerKey,
		Templates:          builds,
		MaxTemplatesPerKey: cfg.MaxTemplatesPerKey, MaxTemplateBuildsPerKey: cfg.MaxTemplateBuildsPerKey,
		MaxTemplateVersions: cfg.MaxTemplateVersions,
		Logger:              rest.RedactingLogger(log.With("part", "api")),
	}
	var cp *controlplane.Plane
	if fl != nil {
		cp, err = controlplane.NewFleet(pcfg, cat, fl, reg)
	} else {
		cp, err = controlplane.New(pcfg, cat, h, reg)
	}
	if err != nil {
		return fail(err)
	}
	srv, err := rest.New(rest.Config{
		Fleet:          fl,
		MaxUploadBytes: cfg.MaxUploadBytes, OpenAPI: openapi, Version: version, Logger: log.With("part", "api"),
		URLSecret: secret, PublicURL: cfg.PublicURL, ProxyDomain: cfg.ProxyDomain,
		TemplateContextDir:      cfg.templateContextDir(),
		TemplateContextMaxBytes: int64(cfg.TemplateContextMaxMiB) << 20,
		MaxEventStreamsPerKey:   cfg.MaxEventStreamsPerKey,
	}, cp, cat, h, reg)
	if err != nil {
		return fail(err)
	}
	return cp, srv, cat, nil
}

// serving is an HTTP server and the loops that run beside it.
type serving struct {
	hs      *http.Server
	errc    chan error
	stopBg  context.CancelFunc
	bgDone  sync.WaitGroup
	stopped bool
}

// startServing serves h on ln as opts say and runs each of loops until
// stop.
func startServing(ln net.Listener, h http.Handler, opts serveOptions, loops ...func(context.Context) error) *serving {
	sv := &serving{hs: opts.httpServer(h), errc: make(chan error, 1)}
	bg, stop := context.WithCancel(context.Background())
	sv.stopBg = stop
	for _, loop := range loops {
		sv.bgDone.Add(1)
		go func() { defer sv.bgDone.Done(); loop(bg) }()
	}
	go func() { sv.errc <- sv.hs.Serve(ln) }()
	return sv
}

// wait returns nil when ctx ends, or the error that stopped serving (then
// having stopped everything).
func (sv *serving) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-sv.errc:
		sv.stop()
		return fmt.Errorf("serve: %w", err)
	}
}

// stop stops taking requests (those in flight get 10 s), then the loops.
// Idempotent.
func (sv *serving) stop() {
	if sv.stopped {
		return
	}
	sv.stopped = true
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sv.hs.Shutdown(sctx); err != nil {
		sv.hs.Close()
	}
	sv.stopBg()
	sv.bgDone.Wait()
}

// serveMetrics serves hs (the metrics) on addr until stop is called.
func serveMetrics(addr string, hs *http.Server, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen for metrics: %w", err)
	}
	go hs.Serve(ln)
	log.Info("serving metrics", "addr", ln.Addr().String())
	return func() { hs.Close() }, nil
}

// vmmsRunning reports whether any sandbox of host has a VMM process.
func vmmsRunning(host *hostagent.Agent) bool {
	for _, info := range host.List() {
		if info.State != hostagent.StatePaused {
			return true
		}
	}
	return false
}

// adoptedIDs are the sandboxes a recovery kept.
func adoptedIDs(rs []hostagent.Recovered) []string {
	var ids []string
	for _, r := range rs {
		if r.Err == nil {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func bootstrapAdmin(ctx context.Context, cat catalog.Catalog, dataDir string, out io.Writer, log *slog.Logger) error {
	n, err := cat.CountKeys(ctx)
	if err != nil {
		return fmt.Errorf("count api keys: %w", err)
	}
	if n > 0 {
		return nil
	}
	k, secret, err := rest.NewKey(ctx, cat, "admin", true, 0, 0)
	if err != nil {
		return err
	}
	path := AdminKeyFile(dataDir)
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin key: %w", err)
	}
	fmt.Fprintf(out, "Created the admin API key (shown once; also saved to %s, mode 0600):\n\n    %s\n\n", path, secret)
	log.Info("created admin api key", "key_id", k.ID, "file", path)
	return nil
}

type dirLock struct{ f *os.File }

// lockWait is how long lockDataDir waits for a data directory's lock: a
// server restarted right after a crash (a supervisor's restart loop)
// must not fail because the lock is still held for a moment, by the old
// process being reaped or by a child it was starting (which holds every
// descriptor until it calls exec).
const lockWait = 5 * time.Second

func lockDataDir(dir, name string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &dirLock{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another panda server is running with data directory %s (%s is locked)", dir, name)
		}
		time.Sleep(50 * time.Millisecond) // polling the lock, bounded by the deadline
	}
}

func (l *dirLock) Close() error { return l.f.Close() }
