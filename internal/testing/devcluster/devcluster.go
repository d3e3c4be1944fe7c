// Package devcluster runs a whole PandaStack fleet on one machine, for
// trying it and for the fleet's tests (`panda dev cluster`): a PostgreSQL
// server holding the catalog (package pgserver), an object store
// (versitygw, package versitygw, or a shared directory), N host agents
// (`panda agent`), each in a network namespace of its own with its own
// data directory, and the control plane (`panda server --fleet`) they
// join. Agents run with networking off: their sandboxes have no network.
//
// It owns everything it starts and makes: Close stops the processes (by
// their IDs: agents first, so that their sandboxes are killed while the
// control plane still records it; then the control plane, the object
// store, PostgreSQL), removes the namespaces, veths and bridge (see
// net.go), unmounts what the agents left mounted and removes a temporary
// data directory. Start first removes what a run of the same Name that
// was killed (SIGKILL, no Close) left behind, from a state file in
// /run/pandastack and by name.
//
// Everything here needs root (namespaces, the agents' XFS stores).
package devcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/lazymem"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/pgserver"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/pandastack/pandastack/internal/testing/versitygw"
)

// Store kinds of Config.Store.
const (
	StoreS3   = "s3"   // versitygw on the bridge, one bucket shared by the agents
	StoreDir  = "dir"  // a directory of the data directory shared by the agents
	StoreNone = "none" // no object store: nothing moves between hosts
)

// Config configures a cluster. Zero fields take the defaults of
// Defaults.
type Config struct {
	Agents  int    // host agents (1 to 50)
	DataDir string // "" is a new temporary directory, removed by Close
	Listen  string // the control plane's REST API
	Store   string // StoreS3, StoreDir or StoreNone
	Images  string // the guest images (make setup), shared by the agents
	// Binary is the panda binary the agents and the control plane run.
	Binary string
	// Versitygw is the versitygw binary (Store s3).
	Versitygw string
	// Name prefixes the namespaces, veths and bridge ("pdev": pdev-br,
	// pdev-a1, ...) and names the state file: 1 to 5 lower-case letters
	// and digits, starting with a letter. Two clusters at once need two
	// names (and two subnets).
	Name string
	// Subnet is the bridge's network: the root namespace has its first
	// address, agent i the (10+i)th.
	Subnet netip.Prefix
	// AgentArgs and ServerArgs are more flags of every agent and of the
	// control plane (e.g. --default-template tiny, --host-lost-after 3s).
	AgentArgs, ServerArgs []string
	// Env is the environment the processes start from (cmd/panda gives
	// its own); the cluster adds the join token and the store's
	// credentials.
	Env []string
	// Out receives progress and the processes' own messages (nil:
	// discarded).
	Out io.Writer
	// ReadyTimeout bounds the wait for every agent to be ready (template
	// bakes included).
	ReadyTimeout time.Duration
	// AgentMemoryMiB is the memory each agent offers the fleet (panda
	// agent --host-memory): 0 shares the machine's out among the agents,
	// so that the scheduler sees one machine's memory, not N times it
	// (each share with the scheduler's reserve on top: the scheduler keeps
	// that much free on every host, and one machine needs it once);
	// negative: each offers the whole machine's.
	AgentMemoryMiB int
	// AgentCPUs is the CPUs each agent offers the fleet (panda agent
	// --host-cpus): 0 shares the machine's out among the agents, at least
	// one each; negative: each offers all of them.
	AgentCPUs int
}

// Defaults are the values of the fields a Config leaves zero.
func Defaults() Config {
	return Config{
		Agents:       3,
		Listen:       "127.0.0.1:7788",
		Store:        StoreS3,
		Images:       "/var/lib/pandastack/images",
		Name:         "pdev",
		Subnet:       netip.MustParsePrefix("10.239.0.0/24"),
		ReadyTimeout: 10 * time.Minute,
	}
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,4}$`)

// withDefaults returns c with its zero fields set, checked.
func (c Config) withDefaults() (Config, error) {
	d := Defaults()
	if c.Agents == 0 {
		c.Agents = d.Agents
	}
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.Store == "" {
		c.Store = d.Store
	}
	if c.Images == "" {
		c.Images = d.Images
	}
	if c.Name == "" {
		c.Name = d.Name
	}
	if !c.Subnet.IsValid() {
		c.Subnet = d.Subnet
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = d.ReadyTimeout
	}
	if c.AgentMemoryMiB == 0 && c.Agents > 0 {
		c.AgentMemoryMiB = host.LocalResources().MemoryMiB/c.Agents + scheduler.ReserveMiB
	}
	if c.AgentCPUs == 0 && c.Agents > 0 {
		c.AgentCPUs = max(1, host.LocalResources().VCPUs/c.Agents)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	var errs []error
	if c.Agents < 1 || c.Agents > 50 {
		errs = append(errs, fmt.Errorf("agents %d: want 1 to 50", c.Agents))
	}
	if !nameRE.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1 to 5 lower-case letters and digits, starting with a letter", c.Name))
	}
	if !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 24 || c.Subnet.Bits() < 8 {
		errs = append(errs, fmt.Errorf("subnet %s: want an IPv4 network of /8 to /24", c.Subnet))
	}
	c.Subnet = c.Subnet.Masked()
	if !slices.Contains([]string{StoreS3, StoreDir, StoreNone}, c.Store) {
		errs = append(errs, fmt.Errorf("store %q: want s3, dir or none", c.Store))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: want HOST:PORT", c.Listen))
	}
	if c.DataDir != "" {
		abs, err := filepath.Abs(c.DataDir)
		if err != nil {
			errs = append(errs, err)
		}
		c.DataDir = abs
	}
	return c, errors.Join(errs...)
}

// Agent is one host agent of the cluster.
type Agent struct {
	ID      string // its host id: agent-N
	URL     string // its host API, https://ADDR:7789 on the bridge
	DataDir string // DATA_DIR/agent-N
	NetNS   string // its namespace, /run/netns/NAME-aN
	p       *proc
}

// PID is the agent process's ID (0 if it is not running).
func (a *Agent) PID() int {
	if !a.p.running() {
		return 0
	}
	return a.p.pid()
}

// Kill kills the agent with SIGKILL, as a crash would; its VMMs keep
// running (VMMPIDs).
func (a *Agent) Kill() { a.p.kill() }

// Stop stops the agent with SIGTERM (it kills its sandboxes).
func (a *Agent) Stop() error { return a.p.stop(agentGrace) }

// Start starts the agent again after Kill or Stop; it adopts the VMMs
// still running and joins the control plane again.
func (a *Agent) Start() error { return a.p.start() }

// VMMPIDs are the QEMU processes serving the agent's sandboxes.
func (a *Agent) VMMPIDs() []int { return testkit.QEMUProcs(a.DataDir) }

// agentGrace is how long an agent may take to stop after SIGTERM: it
// waits up to 10 s for requests, up to 5 s for the control plane to
// follow its events, and kills its sandboxes.
const agentGrace = time.Minute

// agentPort is the port of the agents' host APIs, each on its own address.
const agentPort = 7789

// s3Port is versitygw's port on the bridge address; s3Bucket its bucket.
const (
	s3Port   = 9000
	s3Bucket = "pandastack"
)

// Cluster is a running dev cluster.
type Cluster struct {
	cfg      Config
	dataDir  string
	temp     bool   // dataDir was made by Start: Close removes it
	apiURL   string // the control plane as this machine reaches it
	agentURL string // the control plane as agents reach it
	storeURL string
	pg       *pgserver.Server
	s3       *versitygw.Server
	server   *proc
	agents   []*Agent
	out      *lockedWriter
	state    *stateFile

	// closers undo what Start did, run by Close in reverse order.
	closers []closer
	mu      sync.Mutex
	closed  bool
	// serverDied receives the control plane's unexpected exit;
	// serverUp is set while it serves.
	serverDied chan error
	serverUp   atomic.Bool
	closing    atomic.Bool // Close has begun: exits are expected
}

type closer struct {
	name string
	fn   func() error
}

func (c *Cluster) onClose(name string, fn func() error) {
	c.closers = append(c.closers, closer{name, fn})
}

// progress writes one line of progress.
func (c *Cluster) progress(format string, args ...any) {
	c.out.printf(format+"\n", args...)
}

// Start brings the cluster up and returns once every agent has joined the
// control plane and is ready, or fails, leaving nothing behind. It first
// removes what a killed run of the same name left.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	began := time.Now()
	cfg, err = cfg.withDefaults()
	if err == nil && cfg.Binary == "" {
		err = errors.New("no panda binary")
	}
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("a dev cluster needs root: it makes network namespaces, a bridge and veths, and the agents loop-mount XFS stores")
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, errors.New("nsenter not found (Debian package util-linux): it starts each agent in its network namespace")
	}
	if cfg.Store == StoreS3 {
		if err := versitygw.Check(cfg.Versitygw); err != nil {
			return nil, fmt.Errorf("object store: %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(cfg.Images, "kernel")); err != nil {
		return nil, fmt.Errorf("guest images: %w (run make setup, or give the images directory)", err)
	}
	c := &Cluster{cfg: cfg, out: &lockedWriter{w: cfg.Out}, serverDied: make(chan error, 1)}
	unlock, err := lockName(cfg.Name)
	if err != nil {
		return nil, err
	}
	c.onClose("lock", unlock)
	defer func() {
		if err == nil {
			return
		}
		cerr := c.Close()
		if ctx.Err() != nil {
			// Ctrl-C while starting: processes stopped half-way may
			// well complain; that is no news.
			if cerr != nil {
				c.progress("while stopping: %v", cerr)
			}
			err = fmt.Errorf("interrupted while starting; stopped what had started (%w)", ctx.Err())
		} else if cerr != nil {
			err = fmt.Errorf("%w; and stopping what had started: %v", err, cerr)
		}
	}()
	if err := c.removeLeftovers(); err != nil {
		return nil, err
	}

	// The data directory: the parts' directories in it. PostgreSQL runs
	// as its own user and must pass through it; the rest is root's.
	c.dataDir, c.temp = cfg.DataDir, cfg.DataDir == ""
	if c.temp {
		if c.dataDir, err = os.MkdirTemp("", "panda-dev-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(c.dataDir, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chmod(c.dataDir, 0o711); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.logDir(), 0o700); err != nil {
		return nil, err
	}
	c.state = &stateFile{path: statePath(cfg.Name), DataDir: c.dataDir, Temp: c.temp}
	if err := c.state.save(); err != nil {
		return nil, err
	}
	c.onClose("state file", c.state.remove)
	if c.temp {
		c.onClose("temporary data directory", func() error {
			if left := mountsUnder(c.dataDir); len(left) > 0 {
				return fmt.Errorf("keeping %s: still mounted there: %s", c.dataDir, strings.Join(left, ", "))
			}
			return os.RemoveAll(c.dataDir)
		})
	}
	c.progress("Starting a PandaStack dev cluster of %d agents in %s", cfg.Agents, c.dataDir)

	if err := c.startPostgres(ctx); err != nil {
		return nil, err
	}
	if err := checkSubnet(&cfg); err != nil {
		return nil, err
	}
	c.onClose("network", func() error { _, _, err := removeNetwork(cfg.Name); return err })
	if err := setUpBridge(&cfg); err != nil {
		return nil, err
	}
	var netnses []string
	for i := 1; i <= cfg.Agents; i++ {
		p, err := setUpAgentNet(&cfg, i)
		if err != nil {
			return nil, err
		}
		netnses = append(netnses, p)
	}
	c.progress("network: bridge %s %s, a namespace per agent (%s-a1 …), no route out", cfg.bridgeName(),
		netip.PrefixFrom(cfg.bridgeAddr(), cfg.Subnet.Bits()), cfg.Name)
	if err := c.startStore(ctx); err != nil {
		return nil, err
	}
	if err := c.startServer(ctx); err != nil {
		return nil, err
	}
	if err := c.startAgents(ctx, nsenter, netnses); err != nil {
		return nil, err
	}
	c.progress("Dev cluster ready in %v.", time.Since(began).Round(100*time.Millisecond))
	return c, nil
}

func (c *Cluster) logDir() string { return filepath.Join(c.dataDir, "logs") }

// startPostgres starts PostgreSQL on DATA_DIR/postgres (initdb on first
// start). Its socket is there too unless the path is too long.
func (c *Cluster) startPostgres(ctx context.Context) error {
	dir := filepath.Join(c.dataDir, "postgres")
	sock := dir
	if len(sock) > 80 {
		var err error
		if sock, err = os.MkdirTemp("/tmp", "panda-dev-pg-"); err != nil {
			return err
		}
		c.onClose("postgres socket directory", func() error { return os.RemoveAll(sock) })
	}
	c.progress("postgres: starting in %s", dir)
	pg, err := pgserver.Start(ctx, pgserver.Config{Dir: dir, SocketDir: sock, Durable: true})
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	c.pg = pg
	c.onClose("postgres", pg.Stop)
	c.watch("postgres", pg.Exited(), filepath.Join(dir, "postgres.log"))
	c.state.add("postgres", pg.PID())
	if pg.InitDB > 0 {
		c.progress("postgres: ready in %v (initdb %v)", pg.Ready.Round(10*time.Millisecond), pg.InitDB.Round(10*time.Millisecond))
	} else {
		c.progress("postgres: ready in %v", pg.Ready.Round(10*time.Millisecond))
	}
	return nil
}

// startStore starts the object store the agents share.
func (c *Cluster) startStore(ctx context.Context) error {
	switch c.cfg.Store {
	case StoreNone:
		c.progress("object store: none (sandboxes and snapshots stay on their host)")
		return nil
	case StoreDir:
		dir := filepath.Join(c.dataDir, "objects")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		c.storeURL = dir
		c.progress("object store: the directory %s", dir)
		return nil
	}
	dir := filepath.Join(c.dataDir, "s3")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	secret := make([]byte, 16)
	rand.Read(secret)
	addr := netip.AddrPortFrom(c.cfg.bridgeAddr(), s3Port).String()
	c.s3 = versitygw.New(versitygw.Config{Binary: c.cfg.Versitygw, Dir: dir, Addr: addr, AccessKey: "pandadev",
		SecretKey: hex.EncodeToString(secret), LogFile: filepath.Join(c.logDir(), "versitygw.log")})
	if err := c.s3.Start(ctx); err != nil {
		return fmt.Errorf("object store: %w", err)
	}
	c.onClose("versitygw", func() error { c.s3.Stop(); return nil })
	c.watch("versitygw", c.s3.Exited(), filepath.Join(c.logDir(), "versitygw.log"))
	c.state.add("versitygw", c.s3.PID())
	if err := c.s3.MakeBucket(ctx, s3Bucket); err != nil {
		return fmt.Errorf("object store: %w", err)
	}
	c.storeURL = fmt.Sprintf("s3://%s/dev?endpoint=%s&insecure=1", s3Bucket, addr)
	c.progress("object store: versitygw on %s (bucket %s, files in %s)", addr, s3Bucket, dir)
	return nil
}

// ServerDataDir is the control plane's data directory.
func (c *Cluster) ServerDataDir() string { return filepath.Join(c.dataDir, "server") }

// startServer starts the control plane and, when it listens on loopback,
// a forwarder to it on the bridge for the agents.
func (c *Cluster) startServer(ctx context.Context) error {
	host, port, _ := net.SplitHostPort(c.cfg.Listen)
	ip, err := netip.ParseAddr(host)
	switch {
	case host == "" || err == nil && ip.IsUnspecified():
		c.apiURL = "http://" + net.JoinHostPort("127.0.0.1", port)
		c.agentURL = "http://" + net.JoinHostPort(c.cfg.bridgeAddr().String(), port)
	case err == nil && ip == c.cfg.bridgeAddr():
		c.apiURL = "http://" + c.cfg.Listen
		c.agentURL = c.apiURL
	default:
		c.apiURL = "http://" + c.cfg.Listen
		fwd := netip.AddrPortFrom(c.cfg.bridgeAddr(), 7788).String()
		if port != "0" {
			fwd = net.JoinHostPort(c.cfg.bridgeAddr().String(), port)
		}
		f, err := startForwarder(fwd, c.cfg.Listen)
		if err != nil {
			return fmt.Errorf("forwarder for the agents: %w", err)
		}
		c.onClose("forwarder", f.Close)
		c.agentURL = "http://" + fwd
	}
	argv := append([]string{c.cfg.Binary, "server", "--fleet", "--data-dir", c.ServerDataDir(), "--listen", c.cfg.Listen,
		"--catalog", c.pg.DSN()}, c.cfg.ServerArgs...)
	c.server = &proc{name: "server", argv: argv, env: childEnv(c.cfg.Env), log: filepath.Join(c.logDir(), "server.log"), out: c.out}
	c.server.onExit = func(err error) {
		if !c.serverUp.Load() {
			return // runServer reports it
		}
		c.progress("server:  the control plane exited: %v; the end of its log (%s):\n%s", err, c.server.log, c.server.logTail(2000))
		select {
		case c.serverDied <- fmt.Errorf("the control plane exited: %v", err):
		default:
		}
	}
	c.progress("server: starting the control plane on %s (catalog in postgres)", c.apiURL)
	c.onClose("control plane", func() error { return c.server.stop(time.Minute) })
	if err := c.runServer(ctx); err != nil {
		return err
	}
	// The admin key where panda up keeps it.
	link := filepath.Join(c.dataDir, "admin.key")
	if target, err := os.Readlink(link); err != nil || target != "server/admin.key" {
		os.Remove(link)
		if err := os.Symlink("server/admin.key", link); err != nil {
			return err
		}
	}
	return nil
}

// runServer starts the control plane's process and waits until it
// serves.
func (c *Cluster) runServer(ctx context.Context) (err error) {
	c.serverUp.Store(false)
	defer func() { c.serverUp.Store(err == nil) }()
	if err := c.server.start(); err != nil {
		return err
	}
	c.state.add("server", c.server.pid())
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := hc.Get(c.apiURL + "/healthz")
		if err == nil {
			resp.Body.Close()
			_, kerr := os.Stat(filepath.Join(c.ServerDataDir(), "admin.key"))
			switch {
			case resp.StatusCode != http.StatusOK:
				err = fmt.Errorf("GET /healthz: %s", resp.Status)
			case kerr != nil:
				err = kerr
			default:
				return nil
			}
		}
		select {
		case <-c.server.done():
			return fmt.Errorf("the control plane exited while starting: %v; its log (%s):\n%s", c.server.exitErr(), c.server.log, c.server.logTail(4000))
		case <-ctx.Done():
			return fmt.Errorf("the control plane does not serve on %s: %v (log: %s)", c.apiURL, err, c.server.log)
		case <-tick.C:
		}
	}
}

// RestartServer stops the control plane (SIGTERM) and starts it again;
// it returns once it serves. The agents keep running and their
// sandboxes with them.
func (c *Cluster) RestartServer(ctx context.Context) error {
	if err := c.server.stop(time.Minute); err != nil {
		return err
	}
	return c.runServer(ctx)
}

// ServerPID is the control plane's process ID.
func (c *Cluster) ServerPID() int { return c.server.pid() }

// startAgents starts the agents, each in its namespace, and waits until
// the control plane lists each of them ready.
func (c *Cluster) startAgents(ctx context.Context, nsenter string, netnses []string) error {
	tok, err := os.ReadFile(filepath.Join(c.ServerDataDir(), "join.token"))
	if err != nil {
		return fmt.Errorf("join token: %w", err)
	}
	env := append(childEnv(c.cfg.Env), "PANDA_JOIN_TOKEN="+strings.TrimSpace(string(tok)))
	if c.s3 != nil {
		cr := c.s3.Credentials()
		env = append(env, "AWS_ACCESS_KEY_ID="+cr.AccessKey, "AWS_SECRET_ACCESS_KEY="+cr.SecretKey)
	}
	c.onClose("agents", c.stopAgents)
	for i := 1; i <= c.cfg.Agents; i++ {
		addr := netip.AddrPortFrom(c.cfg.agentAddr(i), agentPort).String()
		a := &Agent{ID: fmt.Sprintf("agent-%d", i), URL: "https://" + addr, DataDir: filepath.Join(c.dataDir, fmt.Sprintf("agent-%d", i)),
			NetNS: netnses[i-1]}
		argv := []string{nsenter, "--net=" + a.NetNS, "--", c.cfg.Binary, "agent", "--data-dir", a.DataDir, "--listen", addr,
			"--server", c.agentURL, "--host-id", a.ID, "--advertise-url", a.URL, "--images", c.cfg.Images,
			"--network", "off", "--network-prefix", fmt.Sprintf("%sa%d", c.cfg.Name, i), "--bake"}
		if c.storeURL != "" {
			argv = append(argv, "--store", c.storeURL)
		}
		if c.cfg.AgentMemoryMiB > 0 {
			argv = append(argv, "--host-memory", strconv.Itoa(c.cfg.AgentMemoryMiB))
		}
		if c.cfg.AgentCPUs > 0 {
			argv = append(argv, "--host-cpus", strconv.Itoa(c.cfg.AgentCPUs))
		}
		argv = append(argv, c.cfg.AgentArgs...)
		a.p = &proc{name: a.ID, argv: argv, env: env, log: filepath.Join(c.logDir(), a.ID+".log"), out: c.out}
		a.p.onExit = func(err error) {
			c.progress("%-8s exited: %v; its sandboxes show lost once the control plane misses its heartbeats (log: %s)", a.ID+":", err, a.p.log)
		}
		c.agents = append(c.agents, a)
	}
	began := time.Now()
	for _, a := range c.agents {
		if err := a.p.start(); err != nil {
			return err
		}
		c.state.add(a.ID, a.p.pid())
	}
	c.progress("agents: %d started, each baking its default template on first start (a few seconds each under TCG; logs in %s)", len(c.agents), c.logDir())
	return c.waitReady(ctx, began)
}

// waitReady polls the control plane's host list until every agent is
// ready, an agent exits, or the ready timeout passes.
func (c *Cluster) waitReady(ctx context.Context, began time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	ready := map[string]bool{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		hosts, err := c.hosts(ctx)
		if err == nil {
			for _, h := range hosts {
				if h.State == "ready" && !ready[h.ID] && slices.ContainsFunc(c.agents, func(a *Agent) bool { return a.ID == h.ID }) {
					ready[h.ID] = true
					c.progress("%-8s ready after %v", h.ID+":", time.Since(began).Round(100*time.Millisecond))
				}
			}
			if len(ready) == len(c.agents) {
				return nil
			}
		}
		for _, a := range c.agents {
			if !a.p.running() {
				return fmt.Errorf("%s exited while starting: %v; the end of its log (%s):\n%s", a.ID, a.p.exitErr(), a.p.log, a.p.logTail(4000))
			}
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("agents not ready within %v (ready: %d of %d; last error: %v); logs in %s", c.cfg.ReadyTimeout, len(ready), len(c.agents), err, c.logDir())
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// hostState is a host as the control plane lists it.
type hostState struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// hosts lists the control plane's hosts.
func (c *Cluster) hosts(ctx context.Context) ([]hostState, error) {
	key, err := c.AdminKey()
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.apiURL+"/v1/hosts", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/hosts: %s", resp.Status)
	}
	var out struct {
		Hosts []hostState `json:"hosts"`
	}
	return out.Hosts, json.NewDecoder(resp.Body).Decode(&out)
}

// stopAgents stops every agent at once (each kills its sandboxes), then
// kills what survived and unmounts their stores.
func (c *Cluster) stopAgents() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.agents))
	for i, a := range c.agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.p.stop(agentGrace)
		}()
	}
	wg.Wait()
	for _, a := range c.agents {
		if pids := testkit.QEMUProcs(a.DataDir); len(pids) > 0 {
			killPIDs(pids)
		}
		// A killed agent's lazy restore holder (its machines are gone).
		if pids := lazymem.HolderPIDs(a.DataDir); len(pids) > 0 {
			killPIDs(pids)
		}
		errs = append(errs, unmountUnder(a.DataDir))
	}
	return errors.Join(errs...)
}

// Wait blocks until ctx ends (the command's Ctrl-C) or the control plane
// exits by itself, which it returns as an error. Agents that exit are
// reported on Out and waited for no more.
func (c *Cluster) Wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-c.serverDied:
		return err
	}
}

// watch reports on Out a part that exits before Close stops it.
func (c *Cluster) watch(name string, exited <-chan struct{}, log string) {
	go func() {
		<-exited
		if !c.closing.Load() {
			c.progress("%s exited by itself: the cluster runs on without it (log: %s)", name, log)
		}
	}()
}

// Close stops everything and removes what Start made; the data directory
// stays unless Start made it. Idempotent.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.closing.Store(true)
	var errs []error
	for i := len(c.closers) - 1; i >= 0; i-- {
		if err := c.closers[i].fn(); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", c.closers[i].name, err))
		}
	}
	return errors.Join(errs...)
}

// URL is the control plane's REST API.
func (c *Cluster) URL() string { return c.apiURL }

// AgentURL is the control plane as the agents reach it.
func (c *Cluster) AgentURL() string { return c.agentURL }

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// AgentMemoryMiB is the memory each agent offers the fleet (0: the
// machine's).
func (c *Cluster) AgentMemoryMiB() int { return max(0, c.cfg.AgentMemoryMiB) }

// AgentCPUs is the CPUs each agent offers the fleet (0: the machine's).
func (c *Cluster) AgentCPUs() int { return max(0, c.cfg.AgentCPUs) }

// Temporary reports whether Close removes the data directory.
func (c *Cluster) Temporary() bool { return c.temp }

// StoreURL is the agents' object store ("" for none).
func (c *Cluster) StoreURL() string { return c.storeURL }

// AdminKeyFile is DATA_DIR/admin.key.
func (c *Cluster) AdminKeyFile() string { return filepath.Join(c.dataDir, "admin.key") }

// AdminKey reads the admin API key.
func (c *Cluster) AdminKey() (string, error) {
	b, err := os.ReadFile(filepath.Join(c.ServerDataDir(), "admin.key"))
	return strings.TrimSpace(string(b)), err
}

// JoinToken reads the token agents join with.
func (c *Cluster) JoinToken() (string, error) {
	b, err := os.ReadFile(filepath.Join(c.ServerDataDir(), "join.token"))
	return strings.TrimSpace(string(b)), err
}

// Agents are the cluster's agents, agent-1 first.
func (c *Cluster) Agents() []*Agent { return c.agents }

// LogDir holds the processes' logs.
func (c *Cluster) LogDir() string { return c.logDir() }

// Postgres is the catalog's URL.
func (c *Cluster) Postgres() string { return c.pg.DSN() }

// childEnv is env without the settings the cluster gives by flags.
func childEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "PANDA_DATA_DIR" || k == "PANDA_JOIN_TOKEN" || strings.HasPrefix(k, "AWS_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// killPIDs SIGKILLs pids and waits until they are gone.
func killPIDs(pids []int) {
	for _, pid := range pids {
		killPID(pid)
	}
	for _, pid := range pids {
		testkit.WaitGone(pid, 10*time.Second)
	}
}
