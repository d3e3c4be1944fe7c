package guest_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/guest"
)

// shellClient is a client of a guest whose bash is at bash and whose
// HOME is home.
func shellClient(t *testing.T, bash, home string, session map[string]string) *guestproto.Client {
	t.Helper()
	tr := guestprototest.New()
	srv := guest.NewServer(guest.Config{
		Hooks: &fakeHooks{}, Reaper: reaper, Version: "test", Bash: bash,
		Env:          []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home},
		LoginEnvFile: filepath.Join(t.TempDir(), "run", "login-env.sh"),
		ExitGrace:    200 * time.Millisecond,
	})
	agent := guestproto.NewAgent(tr, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = tr.Close(); <-done })
	c := guestproto.NewClient(tr.Connect(true))
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Hello(testContext(t), guestproto.HelloRequest{Env: session}); err != nil {
		t.Fatalf("Hello: %v", err)
	}
	return c
}

// TestShellChoice: a command given as a string runs under a login bash
// (bash -l -c) when the guest has bash, else under /bin/sh -c; argv-form
// execs are not touched.
func TestShellChoice(t *testing.T) {
	if _, err := os.Stat(guest.DefaultBash); err != nil {
		t.Fatalf("this machine has no %s (make setup installs bash)", guest.DefaultBash)
	}
	// A bash that appears after the first exec (a template build that
	// installs it) is used from the next exec on.
	late := filepath.Join(t.TempDir(), "bash")
	tests := []struct {
		name, bash string
		req        guestproto.ExecRequest
		want       string
	}{
		{"bash", guest.DefaultBash, guestproto.ExecRequest{Shell: `echo "$0"; shopt -q login_shell && echo login; [[ x == x ]] && echo bash-syntax`}, guest.DefaultBash + "\nlogin\nbash-syntax\n"},
		{"no bash", filepath.Join(t.TempDir(), "no-bash"), guestproto.ExecRequest{Shell: `echo "$0"`}, "/bin/sh\n"},
		{"argv unchanged", guest.DefaultBash, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", `echo "$0"`}}, "/bin/sh\n"},
		{"late bash, before", late, guestproto.ExecRequest{Shell: `echo "$0"`}, "/bin/sh\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := shellClient(t, tt.bash, "/", nil)
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

// TestLoginShellKeepsExplicitEnv: the login profiles run, but what the
// session (template, sandbox) and the command set explicitly wins over
// them; PATH entries the profiles add are kept after the explicit ones;
// the agent's helper variables do not reach the command or its children.
func TestLoginShellKeepsExplicitEnv(t *testing.T) {
	if _, err := os.Stat(guest.DefaultBash); err != nil {
		t.Fatalf("this machine has no %s (make setup installs bash)", guest.DefaultBash)
	}
	home := t.TempDir()
	profile := "export PATH=/profile/bin:$PATH FOO=profile SESSION=profile FROMPROFILE=yes\n"
	if err := os.WriteFile(filepath.Join(home, ".profile"), []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	c := shellClient(t, guest.DefaultBash, home, map[string]string{"SESSION": "from session"})
	script := `printf '%s\n' "$PATH" "$FOO" "$SESSION" "$FROMPROFILE" "${BASH_ENV-unset}" "${PANDA_LOGIN_ENV-unset}"; ` +
		`bash -c 'printf "%s\n" "$FOO" "${BASH_ENV-unset}"'; env | grep -c '^A-B=x$'`
	tests := []struct {
		name string
		env  map[string]string
		want []string // lines; PATH (first) as a prefix
	}{
		{"explicit", map[string]string{"PATH": "/opt/panda:/usr/bin:/bin", "FOO": "it's $HOME `x`", "A-B": "x"},
			[]string{"/opt/panda:/usr/bin:/bin:/profile/bin", "it's $HOME `x`", "from session", "yes", "unset", "unset", "it's $HOME `x`", "unset", "1"}},
		{"session only", map[string]string{"A-B": "x"},
			[]string{"/profile/bin:", "profile", "from session", "yes", "unset", "unset", "profile", "unset", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			res, err := c.Exec(testContext(t), guestproto.ExecRequest{Shell: script, Env: tt.env}, nil, &out, &errOut)
			if err != nil || res.ExitCode != 0 || errOut.Len() != 0 {
				t.Fatalf("Exec: %+v %v (stderr %q)", res, err, errOut.String())
			}
			got := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if len(got) != len(tt.want) || !strings.HasPrefix(got[0], tt.want[0]) {
				t.Fatalf("got %q, want %q (first line as a prefix)", got, tt.want)
			}
			if !slices.Equal(got[1:], tt.want[1:]) {
				t.Errorf("got %q, want %q", got[1:], tt.want[1:])
			}
			if n := strings.Count(":"+got[0]+":", ":/profile/bin:"); n != 1 {
				t.Errorf("PATH %q has /profile/bin %d times", got[0], n)
			}
		})
	}
}
