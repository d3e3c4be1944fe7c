package guest_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/guest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// accountsRoot makes a root with etc/passwd and etc/group, and alice's home
// (owned by her) reachable by every user. It returns the root and the home.
func accountsRoot(t *testing.T) (root, home string) {
	t.Helper()
	root = t.TempDir()
	// t.TempDir's directories are 0700: another user could not enter the home.
	for d := root; d != filepath.Dir(os.TempDir()) && d != "/"; d = filepath.Dir(d) {
		if strings.HasPrefix(d, os.TempDir()+"/") {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	home = filepath.Join(root, "home/alice")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n" +
			"# a comment\n" +
			"alice:x:1000:1000:Alice:" + home + ":/bin/sh\n" +
			"broken line\n" +
			"bob:x:1001:1001::/nonexistent:/bin/sh\n",
		"etc/group": "root:x:0:\nalice:x:1000:\nbob:x:1001:\nstaff:x:50:bob,alice\naudio:x:63:alice\n",
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Join(root, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, home
}

// requireRoot gates a test that runs commands as other users.
func requireRoot(t *testing.T) {
	t.Helper()
	testkit.Root(t)
}

// TestExecUser runs commands as users named in a made-up root's accounts,
// and as numeric ids without entries.
func TestExecUser(t *testing.T) {
	requireRoot(t)
	root, home := accountsRoot(t)
	c := startGuestRoot(t, root).connect(t, guestproto.HelloRequest{Env: map[string]string{"SESSION": "session"}}, true)
	const script = `echo "$(id -u) $(id -g) $(id -G)"; echo "home=$HOME user=$USER logname=$LOGNAME"; pwd`
	tests := []struct {
		name   string
		req    guestproto.ExecRequest
		ids    string // "uid gid" and the supplementary groups in any order
		groups []string
		env    string
		cwd    string
	}{
		{name: "root by default", req: guestproto.ExecRequest{}, ids: "0 0", env: "home=/ user=root logname=", cwd: "/"},
		{name: "name", req: guestproto.ExecRequest{User: "alice"}, ids: "1000 1000", groups: []string{"1000", "50", "63"},
			env: "home=" + home + " user=alice logname=alice", cwd: home},
		{name: "name and group", req: guestproto.ExecRequest{User: "alice:staff"}, ids: "1000 50", groups: []string{"50", "63"},
			env: "home=" + home + " user=alice logname=alice", cwd: home},
		{name: "uid with entry", req: guestproto.ExecRequest{User: "1000"}, ids: "1000 1000", groups: []string{"1000", "50", "63"},
			env: "home=" + home + " user=alice logname=alice", cwd: home},
		{name: "uid:gid", req: guestproto.ExecRequest{User: "1000:1000"}, ids: "1000 1000", groups: []string{"1000", "50", "63"},
			env: "home=" + home + " user=alice logname=alice", cwd: home},
		{name: "missing home", req: guestproto.ExecRequest{User: "bob"}, ids: "1001 1001", groups: []string{"1001", "50"},
			env: "home=/nonexistent user=bob logname=bob", cwd: "/"},
		{name: "uid without entry", req: guestproto.ExecRequest{User: "2000"}, ids: "2000 0", groups: []string{"0"},
			env: "home=/ user= logname=", cwd: "/"},
		{name: "uid:gid without entries", req: guestproto.ExecRequest{User: "65534:65534"}, ids: "65534 65534", groups: []string{"65534"},
			env: "home=/ user= logname=", cwd: "/"},
		{name: "request env and cwd win", req: guestproto.ExecRequest{User: "alice", Env: map[string]string{"HOME": "/tmp", "USER": "me"}, Cwd: "/"},
			ids: "1000 1000", groups: []string{"1000", "50", "63"}, env: "home=/tmp user=me logname=alice", cwd: "/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req
			req.Shell = script
			var out, errOut bytes.Buffer
			res, err := c.Exec(testContext(t), req, nil, &out, &errOut)
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.ExitCode != 0 {
				t.Fatalf("exit %d, stderr %q", res.ExitCode, errOut.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 3 {
				t.Fatalf("output = %q, want 3 lines", out.String())
			}
			f := strings.Fields(lines[0])
			if got := strings.Join(f[:2], " "); got != tt.ids {
				t.Errorf("uid gid = %q, want %q", got, tt.ids)
			}
			if tt.groups != nil {
				got := slices.Sorted(slices.Values(f[2:]))
				want := slices.Sorted(slices.Values(tt.groups))
				if !slices.Equal(got, want) {
					t.Errorf("groups = %v, want %v", got, want)
				}
			}
			if lines[1] != tt.env {
				t.Errorf("env = %q, want %q", lines[1], tt.env)
			}
			if lines[2] != tt.cwd {
				t.Errorf("cwd = %q, want %q", lines[2], tt.cwd)
			}
		})
	}
}

func TestExecUserErrors(t *testing.T) {
	requireRoot(t) // accountsRoot gives a home to another user
	root, _ := accountsRoot(t)
	c := startGuestRoot(t, root).connect(t, guestproto.HelloRequest{}, true)
	tests := []struct {
		user     string
		want     error
		wantText string
	}{
		{"nobody-xyz", guestproto.ErrNotFound, `user "nobody-xyz" not found`},
		{"alice:nogroup", guestproto.ErrNotFound, `group "nogroup" not found`},
		{"1000:nogroup", guestproto.ErrNotFound, `group "nogroup" not found`},
		{"al ice", guestproto.ErrInvalid, "al ice"},
		{"a:b:c", guestproto.ErrInvalid, "b:c"},
		{"4294967295", guestproto.ErrInvalid, "out of range"},
		{":1", guestproto.ErrInvalid, "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.user, func(t *testing.T) {
			_, err := c.Exec(testContext(t), guestproto.ExecRequest{Argv: []string{"true"}, User: tt.user}, nil, nil, nil)
			if !errors.Is(err, tt.want) || err == nil || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("Exec as %q: error = %v, want %v containing %q", tt.user, err, tt.want, tt.wantText)
			}
		})
	}
}

// TestClientExecUser: the client's ExecUser is the default user, and an
// exec's own User wins.
func TestClientExecUser(t *testing.T) {
	requireRoot(t)
	root, _ := accountsRoot(t)
	f := startGuestRoot(t, root)
	c, err := guestproto.NewClientConfig(f.tr.Connect(true), guestproto.ClientConfig{ExecUser: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := testContext(t)
	if _, err := c.Hello(ctx, guestproto.HelloRequest{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ user, want string }{{"", "1000"}, {"0", "0"}, {"2000:2000", "2000"}} {
		var out bytes.Buffer
		if _, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"id", "-u"}, User: tc.user}, nil, &out, nil); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(out.String()); got != tc.want {
			t.Errorf("id -u with User %q: got %q, want %q", tc.user, got, tc.want)
		}
	}
	if _, err := guestproto.NewClientConfig(f.tr.Connect(true), guestproto.ClientConfig{ExecUser: "a b"}); err == nil {
		t.Errorf("an invalid ExecUser was accepted")
	}
}

// oldAgent is a guest agent from before FeatureExecUser: it lists no
// features.
type oldAgent struct{ *guest.Server }

func (a oldAgent) Hello(ctx context.Context, req *guestproto.HelloRequest) guestproto.HelloReply {
	r := a.Server.Hello(ctx, req)
	r.Features = nil
	return r
}

// TestClientExecUserOldAgent: against an agent that does not list
// FeatureExecUser, an exec's own User fails (the agent would run it as
// root) and the client's default user is not applied.
func TestClientExecUserOldAgent(t *testing.T) {
	tr := guestprototest.New()
	srv := guest.NewServer(guest.Config{Hooks: &fakeHooks{}, Reaper: reaper, Env: []string{"PATH=" + os.Getenv("PATH")}})
	agent := guestproto.NewAgent(tr, oldAgent{srv}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = tr.Close(); <-done })

	c, err := guestproto.NewClientConfig(tr.Connect(true), guestproto.ClientConfig{ExecUser: "1000"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Hello(testContext(t), guestproto.HelloRequest{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := c.Exec(testContext(t), guestproto.ExecRequest{Argv: []string{"id", "-u"}}, nil, &out, nil); err != nil {
		t.Fatalf("Exec with the default user: %v", err)
	}
	if got, want := strings.TrimSpace(out.String()), strconv.Itoa(os.Geteuid()); got != want {
		t.Errorf("id -u = %q, want the agent's own %q", got, want)
	}
	_, err = c.Exec(testContext(t), guestproto.ExecRequest{Argv: []string{"true"}, User: "1000"}, nil, nil, nil)
	if !errors.Is(err, guestproto.ErrInvalid) || !strings.Contains(err.Error(), "too old") {
		t.Errorf("Exec as 1000 on an old agent: error = %v, want invalid, too old", err)
	}
}
