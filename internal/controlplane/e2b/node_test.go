package e2b_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// The Node suites of e2e/e2b: the official e2b SDK (sdk.test.mjs, its
// volumes in volume.test.mjs) and @e2b/code-interpreter (code.test.mjs),
// the versions package-lock.json pins, unmodified, configured only by
// E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY. The code interpreter is reached over the sandbox's network
// (the port proxy dials the guest's port 49999), so the servers run with
// sandbox networking on, in network namespaces the test makes (nettest:
// the sandboxes' only "internet" is another test-made namespace), and
// node runs in the server's namespace, where its address is. Both suites
// run in one world per deployment: the templates (base, code-interpreter)
// are baked once per world, at one shape (nodeMemoryMiB).

// nodeMemoryMiB is the memory of every sandbox the suites create (the
// servers' default: E2B's create names none).
const nodeMemoryMiB = "512"

// netArgs are the flags of a host (panda up, panda agent) of the suites'
// world env: sandbox networking in env's host namespace, its resolver
// the test internet's.
func netArgs(env *nettest.Env) []string {
	return []string{"--network", "on", "--network-prefix", "p" + strings.TrimPrefix(env.Prefix, "nt"),
		"--dns-upstream", nettest.DNSAddr.String(), "--default-memory", nodeMemoryMiB}
}

// TestNodeSDK runs the Node suites against a real `panda up`.
func TestNodeSDK(t *testing.T) {
	dir := nodeSuite(t)
	env := nettest.NewEnv(t)
	srv := startPanda(t, pandatest.Options{NetNS: env.Host.Path, Args: netArgs(env)})
	runNodeSuite(t, dir, env, srv.URL(), srv.AdminKey(), srv.Log)
}

// TestNodeSDKSplit runs the same suites against a control plane (`panda
// server`) whose sandboxes live on a host agent (`panda agent`) in another
// process: the E2B routes, envd's and the code interpreter's proxy go
// through the host API. Both run in the world's namespace (the server
// reaches the agent on its loopback).
func TestNodeSDKSplit(t *testing.T) {
	dir := nodeSuite(t)
	env := nettest.NewEnv(t)
	ag := startPanda(t, pandatest.Options{Command: "agent", NetNS: env.Host.Path, Args: netArgs(env)})
	srv := startPanda(t, pandatest.Options{Command: "server", NetNS: env.Host.Path, Args: []string{
		"--agent", ag.URL(),
		"--agent-token-file", filepath.Join(ag.DataDir(), "agent.token"),
		"--agent-ca-file", filepath.Join(ag.DataDir(), "agent-ca.pem"),
	}})
	runNodeSuite(t, dir, env, srv.URL(), srv.AdminKey(), func() string {
		return srv.Log() + "\nagent log:\n" + ag.Log()
	})
}

// startPanda starts panda as opts say, stopped when the test ends (before
// the world's namespaces are removed: they were made first).
func startPanda(t *testing.T, opts pandatest.Options) *pandatest.Server {
	t.Helper()
	s, err := pandatest.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop %s: %v", opts.Command, err)
		}
	})
	return s
}

// nodeSuite checks for node and npm and returns the suite's directory,
// its dependencies installed.
func nodeSuite(t *testing.T) string {
	testkit.VM(t)
	testkit.Root(t) // panda up loop-mounts an XFS image
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run `make setup` (it installs nodejs and npm)", tool)
		}
	}
	dir, err := filepath.Abs("../../../e2e/e2b")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, dir)
	return dir
}

// runNodeSuite runs `node --test` (every *.test.mjs, one file at a time)
// in dir, in env's host namespace, against the server at url.
func runNodeSuite(t *testing.T, dir string, env *nettest.Env, url, key string, serverLog func() string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// nsenter enters the namespace and execs node: one process, which
	// the context's end kills.
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+env.Host.Path, "--", "node", "--test", "--test-concurrency=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_VOLUME_API_URL="+url, "E2B_API_KEY="+key,
		"E2B_DOMAIN=", "E2B_DEBUG=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("node --test: %v\n%s\nserver log:\n%s", err, out.String(), serverLog())
	}
	t.Logf("node --test:\n%s", out.String())
}

// npmCI installs the suite's locked dependencies unless node_modules is
// newer than package-lock.json.
func npmCI(t *testing.T, dir string) {
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	if mods, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err == nil && mods.ModTime().After(lock.ModTime()) {
		return
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
}
