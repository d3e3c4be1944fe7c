// Package pandatest starts real `panda` processes for tests: `panda up`,
// `panda server` or `panda agent` on a data directory and a free port, with
// QEMU under TCG, waited for until they serve; their output kept for failure
// messages; stopped with SIGTERM (SIGKILL a minute later) or crashed with
// SIGKILL; and their data directories checked for leftovers (QEMU processes,
// mounts) and removed.
//
// A test package that uses it ends with Main, which stops what is still
// running and removes the binary it built:
//
//	func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }
//
// Environment (read here because only tests use this package): PANDA_BIN,
// the binary (default: go build ./cmd/panda of this module, once per test
// binary), and PANDA_TEST_IMAGES, the guest images (testkit.Images; default
// /var/lib/pandastack/images, from `make setup`).
//
// It imports only the standard library and golang.org/x/sys: the tests of
// sdk/go use it, and the Go SDK must not depend on other internal packages.
// It is Linux-only, like panda.
package pandatest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
	"github.com/pandastack/pandastack/internal/testing/testkit"

	"golang.org/x/sys/unix"
)

// Options says which process Start runs. The zero value is `panda up` on
// a new temporary data directory.
type Options struct {
	// Command is "up" (the default), "server" or "agent".
	Command string
	// DataDir is the data directory. "" is a new short temporary
	// directory (unix socket paths under it are limited to 108 bytes),
	// removed by Stop.
	DataDir string
	// Addr is the address to listen on; "" is a free port on 127.0.0.1.
	Addr string
	// Images is the guest images directory (up and agent only); "" is
	// testkit.Images().
	Images string
	// Bin is the panda binary; "" is Binary().
	Bin string
	// Args are more flags, after the defaults (--data-dir, --listen and,
	// for up and agent, --images, --accel tcg and, without NetNS,
	// --network off); a flag given again overrides its default.
	Args []string
	// Env are more environment variables (KEY=value), e.g.
	// PANDA_FAILPOINTS.
	Env []string
	// NetNS, if set, is a network namespace (a path such as
	// /run/netns/NAME) the process runs in (entered with nsenter): a test
	// that gives sandboxes a network runs the server in a namespace of its
	// own, whose only "internet" is another test-made namespace. Its API is
	// then reached through HTTPClient, which opens its connections in that
	// namespace.
	NetNS string
}

// startTimeout bounds how long Start waits for the process to serve.
const startTimeout = 3 * time.Minute

// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
const stopTimeout = time.Minute

// FreeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Command returns the command that Start would run for opts, not started
// and without output set: for a process that is expected to fail (a port
// that is taken, a locked data directory, a wrong token). opts.DataDir must
// be set; an empty opts.Addr is a free port. Like Start's, the process gets
// SIGTERM if the thread that started it ends (Start keeps that thread
// locked until the process exits: a caller that starts goroutines which
// lock their threads and exit should too), and its configuration comes
// from flags only (PANDA_DATA_DIR is cleared).
func Command(ctx context.Context, opts Options) (*exec.Cmd, error) {
	if opts.DataDir == "" {
		return nil, errors.New("pandatest.Command: no data directory")
	}
	if opts.Bin == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		opts.Bin = bin
	}
	if opts.Addr == "" {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		opts.Addr = addr
	}
	cmdName := opts.Command
	if cmdName == "" {
		cmdName = "up"
	}
	args := []string{cmdName, "--data-dir", opts.DataDir, "--listen", opts.Addr}
	switch cmdName {
	case "up", "agent":
		images := opts.Images
		if images == "" {
			images = testkit.Images()
		}
		args = append(args, "--images", images, "--accel", "tcg")
		if opts.NetNS == "" {
			// Sandboxes of tests never reach the machine's uplink: a
			// test that gives them a network runs the server in a
			// namespace it made (NetNS) and turns it on.
			args = append(args, "--network", "off")
		}
	case "server":
	default:
		return nil, fmt.Errorf("pandatest.Command: unknown command %q, want up, server or agent", cmdName)
	}
	args = append(args, opts.Args...)
	cmd := exec.CommandContext(ctx, opts.Bin, args...)
	if opts.NetNS != "" {
		// nsenter enters the namespace and execs panda: same process.
		cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + opts.NetNS, "--", opts.Bin}, args...)...)
	}
	cmd.Env = append(append(os.Environ(), "PANDA_DATA_DIR="), opts.Env...)
	// If the test binary dies without stopping it, the kernel stops it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	// Should a child of panda hold its output open, Wait still returns.
	cmd.WaitDelay = 10 * time.Second
	return cmd, nil
}

// Server is a started panda process. Its methods are safe for concurrent
// use.
type Server struct {
	command  string // up, server or agent
	netns    string // Options.NetNS
	url      string
	adminKey string
	dataDir  string
	ownDir   bool // Start made dataDir: Stop removes it
	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd.Wait has returned
	stdout   headBuffer
	log      tailBuffer   // stdout and stderr, interleaved
	problems problemLines // their warnings and errors

	mu      sync.Mutex
	killed  bool // by Kill
	stopped bool // Stop has run
}

// Start starts panda as opts say and waits, for at most three minutes,
// until it answers GET /healthz and, for up and server, has written the
// admin key. If it does not, Start stops it and returns an error with the
// end of its output.
func Start(opts Options) (_ *Server, err error) {
	s := &Server{command: opts.Command, netns: opts.NetNS, dataDir: opts.DataDir, exited: make(chan struct{})}
	if s.command == "" {
		s.command = "up"
	}
	if s.dataDir == "" {
		if s.dataDir, err = os.MkdirTemp("", "pt"); err != nil {
			return nil, fmt.Errorf("make a data directory: %w", err)
		}
		s.ownDir = true
	}
	if opts.Addr == "" {
		if opts.Addr, err = FreeAddr(); err != nil {
			s.removeOwnDir()
			return nil, err
		}
	}
	opts.DataDir = s.dataDir
	s.url = "http://" + opts.Addr
	if s.command == "agent" {
		s.url = "https://" + opts.Addr // the host API is TLS only
	}
	if s.cmd, err = Command(context.Background(), opts); err != nil {
		s.removeOwnDir()
		return nil, err
	}
	s.cmd.Stdout = io.MultiWriter(&s.stdout, &s.log, &s.problems)
	s.cmd.Stderr = io.MultiWriter(&s.log, &s.problems)
	// Linux sends the Pdeathsig when the thread that started the process
	// ends, not the test binary: a goroutine that locks its thread and
	// exits (as nettest's NS.Do does) would end the thread, and the
	// process with it, if it got the one that started it. So the process
	// is started and waited for on a thread kept locked until it exits.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.cmd.Wait()
		close(s.exited)
	}()
	if err := <-started; err != nil {
		s.removeOwnDir()
		return nil, fmt.Errorf("start %s: %w", s.cmd.Path, err)
	}
	register(s)
	defer func() {
		if err != nil {
			s.Kill()
			err = errors.Join(err, s.Stop())
		}
	}()

	keyFile := ""
	if s.command != "agent" {
		keyFile = filepath.Join(s.dataDir, "admin.key")
	}
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited during start (%v); its output:\n%s", s.name(), s.cmd.ProcessState, s.Log())
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%s not serving after %v; its output:\n%s", s.name(), startTimeout, s.Log())
		}
		if s.Healthy() {
			if keyFile == "" {
				return s, nil
			}
			if b, err := os.ReadFile(keyFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
				s.adminKey = string(bytes.TrimSpace(b))
				return s, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) name() string { return "panda " + s.command }

// URL is the base URL of its API: http://127.0.0.1:PORT, or for an agent
// https://127.0.0.1:PORT.
func (s *Server) URL() string { return s.url }

// AgentCAFile is the CA certificate of an agent's host API:
// DATA_DIR/agent-ca.pem.
func (s *Server) AgentCAFile() string { return filepath.Join(s.dataDir, "agent-ca.pem") }

// HTTPClient is a client of its API: for an agent, one that trusts the
// agent's CA (read now: the agent writes it on first start); for a process
// in a network namespace (Options.NetNS), one whose connections are opened
// in that namespace.
func (s *Server) HTTPClient() (*http.Client, error) {
	if s.command != "agent" && s.netns == "" {
		return http.DefaultClient, nil
	}
	tr := &http.Transport{}
	if s.netns != "" {
		tr.DialContext = DialerIn(s.netns)
	}
	if s.command == "agent" {
		b, err := os.ReadFile(s.AgentCAFile())
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("no certificate in %s", s.AgentCAFile())
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	return &http.Client{Transport: tr}, nil
}

// DialerIn returns a dial function whose connections are opened in the
// network namespace at nsPath (e.g. /run/netns/NAME): the socket is made by
// a thread that entered the namespace, then the thread goes back. For
// http.Transport.DialContext.
func DialerIn(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			// The thread is given back only if it is back in its own
			// namespace; else it dies with this goroutine.
			c, err, back := dialFromNetNS(ctx, nsPath, network, addr)
			if back {
				runtime.UnlockOSThread()
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

func dialFromNetNS(ctx context.Context, nsPath, network, addr string) (c net.Conn, err error, back bool) {
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err, true
	}
	defer own.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, err, true
	}
	defer target.Close()
	if err := setns(target); err != nil {
		return nil, fmt.Errorf("enter network namespace %s: %w", nsPath, err), true
	}
	c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
	return c, err, setns(own) == nil
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// AdminKey is the admin API key from DATA_DIR/admin.key ("" for an agent).
func (s *Server) AdminKey() string { return s.adminKey }

// DataDir is its data directory.
func (s *Server) DataDir() string { return s.dataDir }

// PID is its process id.
// Exited is closed when the process has exited (and been waited for).
func (s *Server) Exited() <-chan struct{} { return s.exited }

func (s *Server) PID() int { return s.cmd.Process.Pid }

// Stdout is what it has written to stdout (the first MiB).
func (s *Server) Stdout() string { return s.stdout.String() }

// Log is the end of what it has written to stdout and stderr, for failure
// messages.
func (s *Server) Log() string { return s.log.Tail(8000) }

// Problems are the last 40 lines of its output that its logger marked as
// warnings or errors (level=WARN, level=ERROR), for failure reports: they
// outlive Log's tail.
func (s *Server) Problems() []string { return s.problems.Lines() }

// Healthy reports whether GET /healthz answers 200 now.
func (s *Server) Healthy() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/healthz", nil)
	if err != nil {
		return false
	}
	c, err := s.HTTPClient()
	if err != nil {
		return false
	}
	if c != http.DefaultClient {
		defer c.CloseIdleConnections()
	}
	resp, err := c.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Kill kills the process with SIGKILL, as a crash would, and waits for it.
// The data directory stays as the process left it (Stop still removes one
// Start made); Stop then reports no exit status.
func (s *Server) Kill() {
	s.mu.Lock()
	s.killed = true
	select {
	case <-s.exited:
	default:
		s.cmd.Process.Kill()
	}
	s.mu.Unlock()
	<-s.exited
}

// Stop stops the process: SIGTERM, and SIGKILL if it has not exited a
// minute later; then, if Start made the data directory, it removes it
// (see RemoveDataDir). It returns an error if the process had to be
// killed, exited with a non-zero status, had exited on its own before
// (unless by Kill), or if its data directory was left with QEMU processes
// or mounts or could not be removed. Only the first call does that; later
// calls return nil.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	killed := s.killed
	var errs []error
	select {
	case <-s.exited:
		if !killed {
			errs = append(errs, fmt.Errorf("%s had exited before Stop (%v)", s.name(), s.cmd.ProcessState))
		}
	default:
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
			if !s.cmd.ProcessState.Success() {
				errs = append(errs, fmt.Errorf("%s: %v after SIGTERM, want exit status 0", s.name(), s.cmd.ProcessState))
			}
		case <-time.After(stopTimeout):
			s.cmd.Process.Kill()
			<-s.exited
			errs = append(errs, fmt.Errorf("%s ignored SIGTERM for %v: killed it", s.name(), stopTimeout))
		}
	}
	s.mu.Unlock()
	unregister(s)
	if s.ownDir {
		left, err := RemoveDataDir(s.dataDir)
		for _, l := range left {
			errs = append(errs, fmt.Errorf("%s left behind %s", s.name(), l))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeOwnDir removes the data directory Start made, when nothing ran.
func (s *Server) removeOwnDir() {
	if s.ownDir {
		os.RemoveAll(s.dataDir)
	}
}

// The servers started and not yet stopped, for Main.
var (
	liveMu sync.Mutex
	live   []*Server
)

func register(s *Server) {
	liveMu.Lock()
	defer liveMu.Unlock()
	live = append(live, s)
}

func unregister(s *Server) {
	liveMu.Lock()
	defer liveMu.Unlock()
	live = slices.DeleteFunc(live, func(x *Server) bool { return x == s })
}

// shared is the server of Shared.
var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Shared returns the `panda up` of this test binary (default Options),
// started on the first call; later calls return the same server, or the
// same error. Main stops it.
func Shared() (*Server, error) {
	shared.once.Do(func() {
		shared.s, shared.err = Start(Options{})
		if shared.err != nil {
			shared.err = fmt.Errorf("start the shared panda up: %w", shared.err)
		}
	})
	return shared.s, shared.err
}

// Main runs the tests (m is a *testing.M), then stops every server that is
// still running (Shared's among them) and removes the binary Binary built.
// It returns the exit code for os.Exit: the tests', or 1 if they passed but
// the clean-up failed (a server that would not stop cleanly, leftovers);
// what went wrong is written to stderr.
func Main(m interface{ Run() int }) int {
	code := m.Run()
	liveMu.Lock()
	servers := slices.Clone(live)
	liveMu.Unlock()
	failed := false
	for _, s := range servers {
		if err := s.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pandatest: stop %s on %s: %v\nits output:\n%s\n", s.name(), s.dataDir, err, s.Log())
			failed = true
		}
	}
	if err := removeBinary(); err != nil {
		fmt.Fprintf(os.Stderr, "pandatest: %v\n", err)
		failed = true
	}
	if failed && code == 0 {
		code = 1
	}
	return code
}

// The binary built by Binary.
var built struct {
	once sync.Once
	dir  string // temporary directory holding it
	bin  string
	err  error
}

// Binary returns the panda binary under test: $PANDA_BIN, or else
// ./cmd/panda of the module above the working directory, built on the
// first call into a temporary directory that Main removes.
func Binary() (string, error) {
	if bin := os.Getenv("PANDA_BIN"); bin != "" {
		return bin, nil
	}
	built.once.Do(func() { built.bin, built.dir, built.err = build() })
	return built.bin, built.err
}

func build() (bin, dir string, err error) {
	root, err := moduleRoot()
	if err != nil {
		return "", "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	if dir, err = os.MkdirTemp("", "ptbin"); err != nil {
		return "", "", fmt.Errorf("make a directory for the panda binary: %w", err)
	}
	bin = filepath.Join(dir, "panda")
	cmd := exec.Command(goBin, "build", "-o", bin, "./cmd/panda")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build ./cmd/panda: %v\n%s", err, out)
	}
	return bin, dir, nil
}

func removeBinary() error {
	if built.dir == "" {
		return nil
	}
	if err := os.RemoveAll(built.dir); err != nil {
		return fmt.Errorf("remove the built panda binary: %w", err)
	}
	return nil
}

// moduleRoot finds the directory of the pandastack go.mod above the
// working directory (a test runs in its package's directory).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/pandastack/pandastack\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/pandastack/pandastack above the working directory")
		}
		dir = parent
	}
}

// RemoveDataDir removes the data directory of panda processes that have
// exited. What they must not leave behind it cleans up first and returns,
// one line each: QEMU processes serving dir (killed) and file systems
// mounted under it (unmounted, or detached if busy). err is what kept it
// from removing dir.
func RemoveDataDir(dir string) (leftovers []string, err error) {
	// QEMU first; then lazy restore's holder process, which serves a FUSE
	// mount under dir: killed, its connection is aborted and the mount
	// can go.
	for _, p := range []struct {
		what string
		pids []int
	}{{"QEMU processes", testkit.QEMUProcs(dir)}, {"lazy restore holder processes", HolderPIDs(dir)}} {
		if len(p.pids) == 0 {
			continue
		}
		leftovers = append(leftovers, fmt.Sprintf("%s %v of %s (killed)", p.what, p.pids, dir))
		for _, pid := range p.pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, pid := range p.pids {
			testkit.WaitGone(pid, 10*time.Second)
		}
	}
	for _, mp := range testkit.MountsUnder(dir) {
		// Files of just-killed processes can take a moment to close.
		var err error
		for range 50 {
			if err = syscall.Unmount(mp, 0); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err == nil {
			leftovers = append(leftovers, fmt.Sprintf("%s mounted (unmounted)", mp))
			continue
		}
		open := holders(mp)
		syscall.Unmount(mp, syscall.MNT_DETACH)
		leftovers = append(leftovers, fmt.Sprintf("%s mounted (unmount: %v; open there: %s; detached)", mp, err, open))
	}
	if err := os.RemoveAll(dir); err != nil {
		return leftovers, fmt.Errorf("remove %s: %w", dir, err)
	}
	return leftovers, nil
}

// HolderPIDs lists the live holder processes of lazy restore's mount
// under dir (lazymem.HolderPIDs).
func HolderPIDs(dir string) []int { return lazymem.HolderPIDs(dir) }

// holders lists the processes with files open or mapped under dir.
func holders(dir string) string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		held := false
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); strings.HasPrefix(l, dir+"/") {
				held = true
			}
		}
		if m, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "maps")); bytes.Contains(m, []byte(dir+"/")) {
			held = true
		}
		if held {
			comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
			out = append(out, e.Name()+" ("+strings.TrimSpace(string(comm))+")")
		}
	}
	if len(out) == 0 {
		return "no process"
	}
	return strings.Join(out, ", ")
}
