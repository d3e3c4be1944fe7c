package e2b_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// TestNodeSDK runs e2e/e2b's Node suite: the official e2b SDK (the version
// package-lock.json pins), unmodified, against a real `panda up` with
// sandboxes off the network, configured only by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY. npm ci runs when node_modules is older
// than the lock file (the only network access: the npm registry).
func TestNodeSDK(t *testing.T) {
	dir := nodeSuite(t)
	srv, err := pandatest.Start(pandatest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	runNodeSuite(t, dir, srv.URL(), srv.AdminKey(), srv.Log)
}

// TestNodeSDKSplit runs the same suite against a control plane (`panda
// server`) whose sandboxes live on a host agent (`panda agent`) in another
// process: the E2B routes and envd's go through the host API.
func TestNodeSDKSplit(t *testing.T) {
	dir := nodeSuite(t)
	ag, err := pandatest.Start(pandatest.Options{Command: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ag.Stop() })
	srv, err := pandatest.Start(pandatest.Options{Command: "server", Args: []string{
		"--agent", ag.URL(),
		"--agent-token-file", filepath.Join(ag.DataDir(), "agent.token"),
		"--agent-ca-file", filepath.Join(ag.DataDir(), "agent-ca.pem"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	runNodeSuite(t, dir, srv.URL(), srv.AdminKey(), func() string {
		return srv.Log() + "\nagent log:\n" + ag.Log()
	})
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

// runNodeSuite runs `node --test` in dir against the server at url.
func runNodeSuite(t *testing.T, dir, url, key string, serverLog func() string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
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
