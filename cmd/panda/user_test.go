package main

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// TestExecUser runs commands of a tiny sandbox (whose /etc/passwd has only
// root) as other users, through the buffered and the streamed exec: a
// numeric uid:gid needs no entry, an unknown name is 404 naming it, and a
// malformed user is 422.
func TestExecUser(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	sb := mustCreate(t, ctx, s.client(t))

	const script = `echo "$(id -u) $(id -g) $(id -G) home=$HOME"; pwd`
	for _, tc := range []struct{ user, want string }{
		{"", "0 0 0 home=/root\n/root\n"},
		{"1000:1000", "1000 1000 1000 home=/\n/\n"},
		{"1000", "1000 0 0 home=/\n/\n"},
		{"root", "0 0 0 home=/root\n/root\n"},
	} {
		r, err := sb.Exec(ctx, pandastack.Command{Cmd: script, User: tc.user})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("exec as %q: %+v, %v", tc.user, r, err)
		}
		if r.Stdout != tc.want {
			t.Errorf("exec as %q: got %q, want %q", tc.user, r.Stdout, tc.want)
		}
	}
	// A user's command cannot do what only root may.
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: "touch /root/x", User: "1000:1000"})
	if err != nil || r.ExitCode == 0 {
		t.Errorf("touch /root/x as 1000: %+v, %v; want a failure", r, err)
	}

	for _, tc := range []struct {
		user string
		want error
		text string
	}{
		{"nobody-xyz", pandastack.ErrNotFound, "nobody-xyz"},
		{"1000:staff", pandastack.ErrNotFound, "staff"},
		{"a b", pandastack.ErrInvalid, "a b"},
		{"1:2:3", pandastack.ErrInvalid, "user"},
	} {
		_, err := sb.Exec(ctx, pandastack.Command{Cmd: "true", User: tc.user})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("exec as %q: %v, want %v naming %q", tc.user, err, tc.want, tc.text)
		}
		var out strings.Builder
		_, err = sb.ExecStream(ctx, pandastack.Command{Cmd: "true", User: tc.user}, &out, &out)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("streamed exec as %q: %v, want %v naming %q", tc.user, err, tc.want, tc.text)
		}
	}

	// The CLI's --user, through the streamed exec.
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, bin, "exec", sb.ID, "--user", "65534:65534", "--", "id -u; id -g")
	cmd.Env = append(os.Environ(), "PANDASTACK_API_URL="+s.URL(), "PANDASTACK_API_KEY="+s.AdminKey(), "PANDA_DATA_DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "65534\n65534\n" {
		t.Errorf("panda exec --user 65534:65534: %v, output %q", err, out)
	}
	cmd = exec.CommandContext(ctx, bin, "exec", sb.ID, "--user", "ghost", "--", "true")
	cmd.Env = append(os.Environ(), "PANDASTACK_API_URL="+s.URL(), "PANDASTACK_API_KEY="+s.AdminKey(), "PANDA_DATA_DIR="+dir)
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"ghost"`) {
		t.Errorf("panda exec --user ghost: %v, output %q; want a failure naming ghost", err, out)
	}
	mustStop(t, s)
}
