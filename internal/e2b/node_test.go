package e2b_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/pandatest"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// TestNodeSDK runs e2e/e2b's Node suite: the official e2b SDK (the version
// package-lock.json pins), unmodified, against a real `panda up` with
// sandboxes off the network, configured only by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY. npm ci runs when node_modules is older
// than the lock file (the only network access: the npm registry).
func TestNodeSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: boots sandboxes (QEMU)")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run `make setup` (it installs nodejs and npm)", tool)
		}
	}
	dir, err := filepath.Abs("../../e2e/e2b")
	if err != nil {
		t.Fatal(err)
	}
	npmCI(t, dir)

	srv, err := pandatest.Start(pandatest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-concurrency=1")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+srv.URL(), "E2B_SANDBOX_URL="+srv.URL(), "E2B_API_KEY="+srv.AdminKey(),
		"E2B_DOMAIN=", "E2B_DEBUG=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("node --test: %v\n%s\nserver log:\n%s", err, out.String(), srv.Log())
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
