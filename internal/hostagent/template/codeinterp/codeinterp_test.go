package codeinterp

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

// The embedded files are the server, its kernel module and its node
// driver, under Dir, the server executable; their hash is stable and
// covers the commands.
func TestFiles(t *testing.T) {
	want := map[string]bool{Dir + "/server.py": true, Dir + "/pandastack_kernel.py": true, Dir + "/node_driver.js": true}
	got := Files()
	if len(got) != len(want) {
		t.Fatalf("Files: %d files, want %d", len(got), len(want))
	}
	for i, f := range got {
		if !want[f.Path] {
			t.Errorf("Files: unexpected %s", f.Path)
		}
		if len(f.Data) == 0 {
			t.Errorf("Files: %s is empty", f.Path)
		}
		if i > 0 && got[i-1].Path >= f.Path {
			t.Errorf("Files: not sorted by path: %s before %s", got[i-1].Path, f.Path)
		}
		wantMode := "-rw-r--r--"
		if strings.HasSuffix(f.Path, "/server.py") {
			wantMode = "-rwxr-xr-x"
		}
		if f.Mode.String() != wantMode {
			t.Errorf("%s: mode %s, want %s", f.Path, f.Mode, wantMode)
		}
	}
	if h := Hash(); len(h) != 64 || h != Hash() {
		t.Errorf("Hash: %q, want 64 hex digits, stable", h)
	}
}

// The start command runs the embedded server; the ready command checks
// its health on the port the control plane dials; the startup is valid
// and waits long enough for warm imports under TCG.
func TestStartup(t *testing.T) {
	u := Startup()
	if err := u.Validate(); err != nil {
		t.Fatalf("Startup: %v", err)
	}
	if !strings.Contains(u.StartCmd, Dir+"/server.py") {
		t.Errorf("StartCmd %q does not run %s/server.py", u.StartCmd, Dir)
	}
	if !strings.Contains(u.ReadyCmd, "127.0.0.1:49999/health") || templates.CodeInterpreterPort != 49999 {
		t.Errorf("ReadyCmd %q, port %d: want /health on 49999", u.ReadyCmd, templates.CodeInterpreterPort)
	}
	if u.ReadyTimeout().Minutes() < 5 {
		t.Errorf("ReadyTimeout %s: too short for pandas under TCG", u.ReadyTimeout())
	}
}

// The server's own unit tests (guest/server_test.py: the cell runner over
// a scripted backend, the stream, the JavaScript and bash backends for
// real) pass with the host's python3, node and bash.
func TestServerPython(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-W", "error::ResourceWarning", "guest/server_test.py")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 guest/server_test.py: %v\n%s", err, out)
	}
}
