package cli

import (
	"strconv"
	"strings"
	"testing"
)

func TestIntegrationProc(t *testing.T) {
	itEnv(t)
	id := createSandbox(t)
	ctx := itCtx(t)
	r := mustRun(t, "", "exec", id, "--background", "--keep-stdin", "--", "echo ready; read x; echo got $x; exit 3")
	pid := strings.TrimSpace(r.stdout)
	if n, err := strconv.Atoi(pid); err != nil || n <= 0 {
		t.Fatalf("exec --background printed %q, want a pid", r.stdout)
	}
	if r := mustRun(t, "", "proc", "ls", id); !strings.Contains(r.stdout, pid) || !strings.Contains(r.stdout, "running") {
		t.Errorf("proc ls: %q, want pid %s running", r.stdout, pid)
	}
	mustRun(t, "hi\n", "proc", "stdin", id, pid, "--close")
	if r := runCLI(ctx, "", "proc", "wait", id, pid); r.exitCode() != 3 {
		t.Errorf("proc wait: exit %d (%v), want 3", r.exitCode(), r.err)
	}
	if r := mustRun(t, "", "proc", "logs", id, pid); r.stdout != "ready\ngot hi\n" {
		t.Errorf("proc logs: %q, want %q", r.stdout, "ready\ngot hi\n")
	}
	if r := runCLI(ctx, "", "proc", "signal", id, pid, "TERM"); r.exitCode() == 0 || !strings.Contains(r.err.Error(), "conflict") {
		t.Errorf("signal an exited process: exit %d %v, want a conflict", r.exitCode(), r.err)
	}
	mustRun(t, "", "proc", "kill", id, pid)
	if r := mustRun(t, "", "proc", "ls", id); strings.Contains(r.stdout, pid+" ") {
		t.Errorf("proc ls after kill: %q", r.stdout)
	}
}
