package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

func TestIntegrationShellFromPipe(t *testing.T) {
	itEnv(t)
	id := createSandbox(t)
	r := runCLI(itCtx(t), "echo from-shell; exit 5\n", "shell", id)
	if r.exitCode() != 5 {
		t.Errorf("shell: exit %d (%v), want 5\nstdout: %q\nstderr: %s", r.exitCode(), r.err, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "from-shell\r\n") {
		t.Errorf("shell output %q, want the echo's from-shell", r.stdout)
	}
}

// wsReadUntil reads binary frames until their text contains want; it
// returns the first text frame seen after that point, if any is read
// before want, it fails.
func wsReadUntil(ctx context.Context, t *testing.T, c *websocket.Conn, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var got strings.Builder
	for !strings.Contains(got.String(), want) {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read %q so far, want %q: %v", got.String(), want, err)
		}
		if typ != websocket.MessageBinary {
			t.Fatalf("text frame %s while waiting for %q (read %q)", b, want, got.String())
		}
		got.Write(b)
	}
	return got.String()
}

func TestIntegrationTTYWebSocket(t *testing.T) {
	s := itEnv(t)
	id := createSandbox(t)
	ctx := itCtx(t)
	admin, err := pandastack.NewClient(pandastack.Options{APIURL: s.URL(), APIKey: s.AdminKey()})
	if err != nil {
		t.Fatal(err)
	}
	sb := admin.Sandbox(id)
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: loginShell, Env: map[string]string{"PATH": "/opt/x/bin:/usr/bin:/bin"}, PTY: &pandastack.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatalf("StartProcess: %v", err)
	}
	if p.Info.PTY == nil || *p.Info.PTY != (pandastack.PTYSize{Rows: 24, Cols: 80}) {
		t.Errorf("started %+v, want pty 24x80", p.Info)
	}
	u, err := ttyURL(s.URL(), id, p.PID)
	if err != nil {
		t.Fatal(err)
	}

	// As a browser does: the key as a subprotocol, no Authorization.
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{Subprotocols: []string{"pandastack.v1", "bearer." + s.AdminKey()}})
	if err != nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	defer c.CloseNow()
	if c.Subprotocol() != "pandastack.v1" {
		t.Errorf("subprotocol %q, want pandastack.v1", c.Subprotocol())
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo hi\r")); err != nil {
		t.Fatal(err)
	}
	wsReadUntil(ctx, t, c, "\nhi\r\n")
	// The terminal has the command's env (tiny: sh -l, no /etc/profile).
	if err := c.Write(ctx, websocket.MessageBinary, []byte("echo \"$PATH\"\r")); err != nil {
		t.Fatal(err)
	}
	wsReadUntil(ctx, t, c, "\n/opt/x/bin:/usr/bin:/bin\r\n")
	resize, _ := json.Marshal(map[string]any{"type": "resize", "rows": 30, "cols": 100})
	if err := c.Write(ctx, websocket.MessageText, resize); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageBinary, []byte("stty size\r")); err != nil {
		t.Fatal(err)
	}
	wsReadUntil(ctx, t, c, "30 100\r\n")

	// Bad sizes, then another key: 404 for its sandbox.
	if err := p.Resize(ctx, 0, 80); !errors.Is(err, pandastack.ErrInvalid) {
		t.Errorf("resize to 0x80: %v, want ErrInvalid", err)
	}
	if err := p.Resize(ctx, 24, 1001); !errors.Is(err, pandastack.ErrInvalid) {
		t.Errorf("resize to 24x1001: %v, want ErrInvalid", err)
	}
	if _, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "true", PTY: &pandastack.PTYSize{Rows: 2000, Cols: 80}}); !errors.Is(err, pandastack.ErrInvalid) {
		t.Errorf("start on a 2000-row terminal: %v, want ErrInvalid", err)
	}
	k, err := admin.CreateKey(ctx, "tty-other", false, pandastack.Quotas{})
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	other, err := pandastack.NewClient(pandastack.Options{APIURL: s.URL(), APIKey: k.Key})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Sandbox(id).ProcessHandle(p.PID).Resize(ctx, 30, 100); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("resize with another key: %v, want ErrNotFound", err)
	}
	if _, res, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + k.Key}}}); err == nil || res == nil || res.StatusCode != http.StatusNotFound {
		t.Errorf("tty with another key: %v, want 404", err)
	}
	if _, res, err := websocket.Dial(ctx, u, nil); err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("tty without a key: %v, want 401", err)
	}

	if err := c.Write(ctx, websocket.MessageBinary, []byte("exit 3\r")); err != nil {
		t.Fatal(err)
	}
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read until the exit frame: %v", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		var f ttyFrame
		if err := json.Unmarshal(b, &f); err != nil || f.Type != "exit" || f.ExitCode == nil || *f.ExitCode != 3 {
			t.Fatalf("text frame %s, want an exit frame with exit_code 3", b)
		}
		break
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Errorf("after the exit frame: %v, want a normal close", err)
	}
}
