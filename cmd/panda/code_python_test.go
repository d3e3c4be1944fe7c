package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// codePythonMinTests is how many tests sdk/python/tests/code_integration.py
// has at least: fewer ran means the module lost some (or unittest found
// none), which must fail rather than pass quietly.
const codePythonMinTests = 13

// TestCodePythonSDK runs the Python SDK's code interpreter tests
// (sdk/python/tests/code_integration.py: run_code, results, errors,
// timeouts, contexts, bash, JavaScript, the asyncio twin) against the code
// tests' shared server, on one code-interpreter sandbox this test creates
// and kills. The server lives in a test-made network namespace, so python
// runs inside it (nsenter), as the security tests run chromium.
func TestCodePythonSDK(t *testing.T) {
	w := codeWorld(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("the Python SDK's tests need python3: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	sb := w.codeSandbox(t, ctx, "")

	dir := filepath.Join(repoRoot(t), "sdk", "python", "tests")
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+w.env.Host.Path, "--",
		"python3", "-m", "unittest", "-v", "code_integration")
	cmd.Dir = dir
	cmd.Env = append(withoutPandaEnv(os.Environ()),
		"PANDASTACK_API_URL="+w.URL(),
		"PANDASTACK_API_KEY="+w.AdminKey(),
		"PANDASTACK_TEST_CODE_SANDBOX="+sb.ID,
		"PYTHONDONTWRITEBYTECODE=1",
	)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Its own process group, killed whole when the context ends; Pdeathsig
	// fires when the thread that started it ends, so that thread stays
	// locked until python exits.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	runtime.LockOSThread()
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything it left behind
	}
	runtime.UnlockOSThread()
	if ctx.Err() != nil {
		t.Fatalf("the Python SDK's code tests did not finish in time; their output:\n%s", out.String())
	}
	if err != nil {
		t.Fatalf("the Python SDK's code tests failed (%v); their output:\n%s", err, out.String())
	}
	t.Logf("the Python SDK's code tests:\n%s", out.String())
	// "OK" alone: "OK (skipped=N)" would mean tests that did not run.
	ran, ok := unittestSummary(out.String())
	if !ok || ran < codePythonMinTests {
		t.Errorf("unittest ran %d tests (ok=%v), want at least %d, all passing and none skipped", ran, ok, codePythonMinTests)
	}
}

// unittestSummary reads the end of `python3 -m unittest` output: how many
// tests ran and whether the run ended "OK".
func unittestSummary(out string) (ran int, ok bool) {
	m := regexp.MustCompile(`(?m)^Ran (\d+) tests? in `).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0, false
	}
	ran, _ = strconv.Atoi(m[len(m)-1][1])
	return ran, regexp.MustCompile(`(?m)^OK$`).MatchString(out)
}

// withoutPandaEnv is env without the PANDASTACK_ variables of whoever runs
// the tests, so that the SDK talks to the test's server only.
func withoutPandaEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PANDASTACK_") {
			out = append(out, kv)
		}
	}
	return out
}
