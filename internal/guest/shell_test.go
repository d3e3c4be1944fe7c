package guest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/guest"
	"github.com/pandastack/pandastack/internal/guestproto"
	"github.com/pandastack/pandastack/internal/guestproto/guestprototest"
)

// shellClient is a client of a guest whose bash is at bash.
func shellClient(t *testing.T, bash string) *guestproto.Client {
	t.Helper()
	tr := guestprototest.New()
	srv := guest.NewServer(guest.Config{
		Hooks: &fakeHooks{}, Reaper: reaper, Version: "test", Bash: bash,
		Env:       []string{"PATH=" + os.Getenv("PATH"), "HOME=/"},
		ExitGrace: 200 * time.Millisecond,
	})
	agent := guestproto.NewAgent(tr, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = tr.Close(); <-done })
	c := guestproto.NewClient(tr.Connect(true))
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Hello(testContext(t), guestproto.HelloRequest{}); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return c
}

// TestShellChoice: a command given as a string runs under bash -c (not a
// login shell) when the guest has bash, else under /bin/sh -c; argv-form
// execs are not touched.
func TestShellChoice(t *testing.T) {
	if _, err := os.Stat(guest.DefaultBash); err != nil {
		t.Skipf("this machine has no %s", guest.DefaultBash)
	}
	// A bash that appears after the first exec (a template build that
	// installs it) is used from the next exec on.
	late := filepath.Join(t.TempDir(), "bash")
	tests := []struct {
		name, bash string
		req        guestproto.ExecRequest
		want       string
	}{
		{"bash", guest.DefaultBash, guestproto.ExecRequest{Shell: `echo "$0"; shopt -q login_shell && echo login; [[ x == x ]] && echo bash-syntax`}, guest.DefaultBash + "\nbash-syntax\n"},
		{"no bash", filepath.Join(t.TempDir(), "no-bash"), guestproto.ExecRequest{Shell: `echo "$0"`}, "/bin/sh\n"},
		{"argv unchanged", guest.DefaultBash, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", `echo "$0"`}}, "/bin/sh\n"},
		{"late bash, before", late, guestproto.ExecRequest{Shell: `echo "$0"`}, "/bin/sh\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := shellClient(t, tt.bash)
			var out, errOut bytes.Buffer
			res, err := c.Exec(testContext(t), tt.req, nil, &out, &errOut)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("Exec: %+v %v (stderr %q)", res, err, errOut.String())
			}
			if got := out.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if tt.bash != late {
				return
			}
			if err := os.Symlink(guest.DefaultBash, late); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			if _, err := c.Exec(testContext(t), tt.req, nil, &out, &errOut); err != nil {
				t.Fatal(err)
			}
			if got, want := out.String(), late+"\n"; got != want {
				t.Errorf("after bash appeared: got %q, want %q", got, want)
			}
			// And when it goes away again, /bin/sh takes over.
			if err := os.Remove(late); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			if _, err := c.Exec(testContext(t), tt.req, nil, &out, &errOut); err != nil {
				t.Fatal(err)
			}
			if got, want := out.String(), "/bin/sh\n"; got != want {
				t.Errorf("after bash went away: got %q, want %q", got, want)
			}
		})
	}
}
