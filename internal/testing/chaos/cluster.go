package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"golang.org/x/sys/unix"
)

// The processes of a deployment, by role: in up mode the server is
// `panda up` and there is no agent; in split mode a `panda server` and a
// `panda agent` share one data directory (each locks its own files; the
// server finds the agent's token there).
const (
	roleServer = "server"
	roleAgent  = "agent"
)

// cluster is the panda processes under test, on one data directory and
// fixed addresses, so that a process restarted after a crash serves where
// the last one did.
type cluster struct {
	cfg       Config
	dataDir   string
	addr      string // the REST API
	agentAddr string // split mode: the host API
	procs     map[string]*pandatest.Server
	last      map[string]*pandatest.Server   // role → its last process, for its output
	runs      map[string][]*pandatest.Server // role → every process it had, for their warnings and errors
	armed     map[string]string              // role → failpoint enabled in its process
	netns     string                         // the host namespace of the network world ("": networking off)
	netPrefix string                         // of the deployment's namespaces
	hc        *http.Client
	transport *http.Transport
	adminKey  string
}

func newCluster(cfg Config, dataDir string, world *nettest.Env) (*cluster, error) {
	c := &cluster{cfg: cfg, dataDir: dataDir, procs: map[string]*pandatest.Server{}, last: map[string]*pandatest.Server{},
		runs: map[string][]*pandatest.Server{}, armed: map[string]string{}}
	if world != nil {
		c.netns = world.Host.Path
		c.netPrefix = "c" + strings.TrimPrefix(world.Prefix, "nt")
	}
	var err error
	if c.addr, err = pandatest.FreeAddr(); err != nil {
		return nil, err
	}
	if cfg.Split {
		if c.agentAddr, err = pandatest.FreeAddr(); err != nil {
			return nil, err
		}
	}
	// Requests after a restart must not reuse connections to the dead
	// process: closeIdle drops them.
	c.transport = &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}
	if c.netns != "" {
		c.transport.DialContext = pandatest.DialerIn(c.netns)
	}
	c.hc = &http.Client{Transport: c.transport}
	return c, nil
}

// roles are the roles of the deployment, in start order.
func (c *cluster) roles() []string {
	if c.cfg.Split {
		return []string{roleAgent, roleServer}
	}
	return []string{roleServer}
}

// options are the pandatest options of role's process, with failpoint
// enabled in it ("" for none).
func (c *cluster) options(role, failpoint string) pandatest.Options {
	host := []string{"--accel", c.cfg.Accel, "--default-template", c.cfg.Template,
		"--default-memory", strconv.Itoa(c.cfg.MemoryMiB), "--bake"}
	if c.netns != "" {
		// No pool: every namespace of the prefix then belongs to a
		// running sandbox, which the checks verify.
		host = append(host, "--network", "on", "--network-prefix", c.netPrefix, "--network-pool-size", "-1",
			"--dns-upstream", nettest.DNSAddr.String())
	}
	o := pandatest.Options{DataDir: c.dataDir, Bin: c.cfg.Bin, Images: c.cfg.Images, NetNS: c.netns}
	switch {
	case !c.cfg.Split:
		o.Command, o.Addr, o.Args = "up", c.addr, host
	case role == roleAgent:
		o.Command, o.Addr, o.Args = "agent", c.agentAddr, host
	default:
		o.Command, o.Addr, o.Args = "server", c.addr, []string{"--agent", "https://" + c.agentAddr} // trusting DATA_DIR/agent-ca.pem
	}
	if failpoint != "" {
		o.Env = []string{"PANDA_FAILPOINTS=" + failpoint + "=crash"}
	}
	return o
}

// start starts role's process (which must not be running) with failpoint
// enabled ("" for none) and waits until it serves.
func (c *cluster) start(role, failpoint string) error {
	p, err := pandatest.Start(c.options(role, failpoint))
	if err != nil {
		return fmt.Errorf("start panda %s: %w", role, err)
	}
	c.procs[role], c.last[role] = p, p
	c.runs[role] = append(c.runs[role], p)
	c.armed[role] = failpoint
	if role == roleServer && c.adminKey == "" {
		c.adminKey = p.AdminKey()
	}
	c.transport.CloseIdleConnections()
	return nil
}

// anyArmed reports whether a process runs with a failpoint.
func (c *cluster) anyArmed() bool {
	for _, p := range c.armed {
		if p != "" {
			return true
		}
	}
	return false
}

// startAll starts every process, in order.
func (c *cluster) startAll() error {
	for _, role := range c.roles() {
		if err := c.start(role, ""); err != nil {
			return err
		}
	}
	return nil
}

// exited reports whether role's process has exited (crashed at a
// failpoint, or killed).
func (c *cluster) exited(role string) bool {
	p := c.procs[role]
	if p == nil {
		return true
	}
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}

// waitExitedOrHealthy waits, at most until d has passed, until role's
// process has exited or answers /healthz; it reports whether it exited. A
// process that has just hit a failpoint is killing itself: requests to it
// have failed but it may not have been reaped yet.
func (c *cluster) waitExitedOrHealthy(role string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if c.exited(role) {
			return true
		}
		if c.procs[role].Healthy() || time.Now().After(deadline) {
			return c.exited(role)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill crashes role's process with SIGKILL and waits for it.
func (c *cluster) kill(role string) {
	if p := c.procs[role]; p != nil {
		p.Kill()
		p.Stop() // forget it: nothing to report of a crash
	}
	c.procs[role] = nil
	c.armed[role] = ""
}

// reap forgets role's process that exited by itself (at a failpoint).
func (c *cluster) reap(role string) {
	c.kill(role)
}

// term stops role's process with SIGTERM and returns an error unless it
// exits with status 0 within a minute.
func (c *cluster) term(role string) error {
	p := c.procs[role]
	if p == nil {
		return nil
	}
	c.procs[role] = nil
	c.armed[role] = ""
	if err := p.Stop(); err != nil {
		return fmt.Errorf("panda %s after SIGTERM: %w; its output:\n%s", role, err, p.Log())
	}
	return nil
}

// pid is role's process id (0 if none runs).
func (c *cluster) pid(role string) int {
	if p := c.procs[role]; p != nil && !c.exited(role) {
		return p.PID()
	}
	return 0
}

// logs is, for failure reports, first the warnings and errors every
// process logged (they name the cause of most failures, and outlive the
// tail), then the end of each role's last process's output.
func (c *cluster) logs() string {
	var b strings.Builder
	for _, role := range c.roles() {
		var lines []string
		for i, p := range c.runs[role] {
			for _, l := range p.Problems() {
				lines = append(lines, fmt.Sprintf("[run %d, pid %d] %s", i+1, p.PID(), l))
			}
		}
		if len(lines) > 0 {
			fmt.Fprintf(&b, "--- warnings and errors of panda %s (%d runs) ---\n%s\n", role, len(c.runs[role]), strings.Join(lines, "\n"))
		}
	}
	for _, role := range c.roles() {
		if p := c.last[role]; p != nil {
			state := "running"
			select {
			case <-p.Exited():
				state = "exited"
			default:
			}
			fmt.Fprintf(&b, "--- end of the output of panda %s (pid %d, %s) ---\n%s\n", role, p.PID(), state, p.Log())
		}
	}
	return b.String()
}

// client is an SDK client of the REST API with key.
func (c *cluster) client(key string) (*pandastack.Client, error) {
	return pandastack.NewClient(pandastack.Options{APIURL: "http://" + c.addr, APIKey: key, HTTPClient: c.hc, UserAgent: "panda-chaos"})
}

// waitReady waits until the REST API answers and, in split mode, reaches
// its host agent, for at most d.
func (c *cluster) waitReady(ctx context.Context, admin *pandastack.Client, d time.Duration) error {
	deadline := time.Now().Add(d)
	var last error
	for {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		hosts, err := admin.Hosts(hctx)
		cancel()
		switch {
		case err != nil:
			last = err
		case len(hosts) != 1 || hosts[0].State != "ready":
			last = fmt.Errorf("hosts %+v, want one ready", hosts)
		default:
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment not ready after %v: %w", d, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopAll stops every process with SIGTERM, server first; the errors say
// which did not exit with status 0.
func (c *cluster) stopAll() error {
	var errs []error
	for _, role := range []string{roleServer, roleAgent} {
		if err := c.term(role); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killQEMU kills the VMM of sandbox id with SIGKILL, if it runs: the pid
// recorded in run/ID/vmm.pid, if that process is a QEMU whose command line
// names the sandbox's run directory. It returns the pid killed (0: none).
func (c *cluster) killQEMU(id string) int {
	runDir := filepath.Join(c.dataDir, "run", id)
	b, err := os.ReadFile(filepath.Join(runDir, "vmm.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	argv, ok := qemuArgv(pid, c.dataDir)
	if !ok || !strings.Contains(strings.Join(argv, " "), runDir+"/") {
		return 0
	}
	if unix.Kill(pid, unix.SIGKILL) != nil {
		return 0
	}
	testkit.WaitGone(pid, 10*time.Second)
	return pid
}

// vmmState describes the VMM of sandbox id: its pid, process state and
// the CPU time it used over one second.
func (c *cluster) vmmState(id string) string {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "run", id, "vmm.pid"))
	if err != nil {
		return "no vmm.pid"
	}
	pid := strings.TrimSpace(string(b))
	stat := func() (string, int) {
		b, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return "gone", 0
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			return "?", 0
		}
		u, _ := strconv.Atoi(f[11])
		s, _ := strconv.Atoi(f[12])
		return f[0], u + s
	}
	st, t0 := stat()
	time.Sleep(time.Second) // measuring CPU use, not waiting for anything
	_, t1 := stat()
	return fmt.Sprintf("QEMU %s state %s, %d CPU ticks in 1 s", pid, st, t1-t0)
}
