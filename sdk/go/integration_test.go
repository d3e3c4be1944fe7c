package pandastack_test

// Integration tests against a real server: `panda up` with its own data
// directory on a free port, QEMU with TCG, template tiny at 256 MiB. The
// server (pandatest.Shared) is started on first use and stopped by
// TestMain; the unit tests of this package do not need it.
//
// Environment: PANDA_BIN (default: build ./cmd/panda), PANDA_TEST_IMAGES
// (default /var/lib/pandastack/images, from `make setup`).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// testServer returns the shared server, starting it on first use.
func testServer(t *testing.T) *pandatest.Server {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t) // panda up loop-mounts an XFS image
	s, err := pandatest.Shared()
	if err != nil {
		t.Fatalf("cannot start the server: %v", err)
	}
	return s
}

// --- helpers ---

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func adminClient(t *testing.T) *pandastack.Client {
	t.Helper()
	return clientWithKey(t, testServer(t).AdminKey())
}

func clientWithKey(t *testing.T, key string) *pandastack.Client {
	t.Helper()
	c, err := pandastack.NewClient(pandastack.Options{APIURL: testServer(t).URL(), APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newKey makes a non-admin key and returns a client using it.
func newKey(t *testing.T, q pandastack.Quotas) (*pandastack.Client, pandastack.KeyWithSecret) {
	t.Helper()
	k, err := adminClient(t).CreateKey(testCtx(t), "test-"+t.Name(), false, q)
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	if k.Key == "" || k.ID == "" || k.Admin {
		t.Fatalf("got key %+v, want an id, a secret and admin false", k)
	}
	return clientWithKey(t, k.Key), k
}

// create makes a tiny sandbox that is killed at the end of the test.
func create(t *testing.T, c *pandastack.Client, opts pandastack.CreateOptions) *pandastack.Sandbox {
	t.Helper()
	if opts.Template == "" {
		opts.Template = "tiny"
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = 256
	}
	sb, err := c.Create(testCtx(t), opts)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Kill(ctx); err != nil && !errors.Is(err, pandastack.ErrNotFound) && !errors.Is(err, pandastack.ErrUnauthorized) {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	return sb
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v", what, err, want)
	}
}

// --- tests ---

func TestIntegrationHealth(t *testing.T) {
	h, err := adminClient(t).Health(testCtx(t))
	if err != nil || h.Status != "ok" {
		t.Errorf("got %+v %v, want status ok", h, err)
	}
}

var idRE = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

func TestIntegrationCreateExec(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	before := time.Now()
	sb := create(t, c, pandastack.CreateOptions{
		TTLSeconds: 600, Metadata: map[string]string{"test": "create"}, Env: map[string]string{"FROM_CREATE": "c1"},
	})
	i := sb.Info
	if !idRE.MatchString(sb.ID) || i.ID != sb.ID || i.Template != "tiny" || i.State != pandastack.StateRunning || i.MemoryMiB != 256 || i.VCPUs < 1 {
		t.Errorf("got %+v, want a running tiny sandbox of 256 MiB", i)
	}
	if i.CreatedAt.Before(before.Add(-time.Minute)) || i.CreatedAt.After(time.Now().Add(time.Minute)) {
		t.Errorf("got created_at %v, want about now", i.CreatedAt)
	}
	// The TTL counts from some time during the create (which may bake the
	// template first): expiry is 600 s after a moment within the call.
	after := time.Now()
	if i.ExpiresAt.Before(before.Add(595*time.Second)) || i.ExpiresAt.After(after.Add(605*time.Second)) {
		t.Errorf("got expires_at %v, want 600 s after a moment between %v and %v", i.ExpiresAt, before, after)
	}
	if i.Metadata["test"] != "create" {
		t.Errorf("got metadata %v", i.Metadata)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != sb.ID || got.Info.State != pandastack.StateRunning || !got.Info.CreatedAt.Equal(i.CreatedAt) {
		t.Errorf("Get: got %+v, want %+v", got.Info, i)
	}

	tests := []struct {
		name string
		cmd  pandastack.Command
		want pandastack.ExecResult
	}{
		{"shell", pandastack.Command{Cmd: "echo hello && echo oops >&2"}, pandastack.ExecResult{Stdout: "hello\n", Stderr: "oops\n"}},
		{"exit code", pandastack.Command{Cmd: "exit 3"}, pandastack.ExecResult{ExitCode: 3}},
		{"argv", pandastack.Command{Argv: []string{"printf", "%s|", "a b", "c"}}, pandastack.ExecResult{Stdout: "a b|c|"}},
		{"env", pandastack.Command{Cmd: `echo "$FROM_CREATE $FROM_CMD"`, Env: map[string]string{"FROM_CMD": "x y"}}, pandastack.ExecResult{Stdout: "c1 x y\n"}},
		{"cwd", pandastack.Command{Cmd: "pwd", Cwd: "/tmp"}, pandastack.ExecResult{Stdout: "/tmp\n"}},
		{"default cwd", pandastack.Command{Cmd: "pwd"}, pandastack.ExecResult{Stdout: "/root\n"}},
		{"stdin", pandastack.Command{Argv: []string{"cat"}, Stdin: "from stdin"}, pandastack.ExecResult{Stdout: "from stdin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := sb.Exec(ctx, tt.cmd)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tt.want.ExitCode || res.Stdout != tt.want.Stdout || res.Stderr != tt.want.Stderr || res.TimedOut || res.Truncated {
				t.Errorf("got %+v, want %+v", res, tt.want)
			}
			if res.DurationMS < 0 {
				t.Errorf("got duration %d ms", res.DurationMS)
			}
		})
	}
	t.Run("timeout", func(t *testing.T) {
		// The server's verdict, not a stopwatch: timed out, killed by a
		// signal.
		res, err := sb.Exec(ctx, pandastack.Command{Cmd: "sleep 30", Timeout: 1 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || res.ExitCode == 0 || res.Signal == "" {
			t.Errorf("got %+v, want timed_out, a signal and a non-zero exit code", res)
		}
	})
	t.Run("killed by signal", func(t *testing.T) {
		res, err := sb.Exec(ctx, pandastack.Command{Cmd: "kill -9 $$"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 128+9 || res.Signal != "SIGKILL" {
			t.Errorf("got %+v, want exit 137 and SIGKILL", res)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		_, err := sb.Exec(ctx, pandastack.Command{Cmd: "pwd", Cwd: "relative/dir"})
		wantErr(t, "relative cwd", err, pandastack.ErrInvalid)
	})
}

// recorder records writes and when the first one happened.
type recorder struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first time.Time
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.first.IsZero() {
		r.first = time.Now()
	}
	return r.buf.Write(p)
}

func TestIntegrationExecStream(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	sb := create(t, c, pandastack.CreateOptions{})

	t.Run("live", func(t *testing.T) {
		var out, errw recorder
		res, err := sb.ExecStream(ctx, pandastack.Command{Cmd: "echo first; sleep 2; echo second; echo warn >&2; exit 4"}, &out, &errw)
		end := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 4 || out.buf.String() != "first\nsecond\n" || errw.buf.String() != "warn\n" {
			t.Errorf("got %+v stdout %q stderr %q", res, out.buf.String(), errw.buf.String())
		}
		if gap := end.Sub(out.first); gap < time.Second {
			t.Errorf("the first line arrived %v before the end, want it streamed (about 2 s before)", gap)
		}
	})
	t.Run("large output", func(t *testing.T) {
		var out bytes.Buffer
		res, err := sb.ExecStream(ctx, pandastack.Command{Cmd: "head -c 5000000 /dev/zero | tr '\\0' x"}, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || out.Len() != 5000000 || strings.Trim(out.String(), "x") != "" {
			t.Errorf("got %+v and %d bytes, want 5000000 x", res, out.Len())
		}
	})
	t.Run("executable not found", func(t *testing.T) {
		_, err := sb.ExecStream(ctx, pandastack.Command{Argv: []string{"/no/such/program"}}, nil, nil)
		var e *pandastack.Error
		if !errors.As(err, &e) || e.Status < 400 || e.Status > 499 {
			t.Errorf("got %v, want an HTTP 4xx error", err)
		}
	})
	t.Run("cancel kills", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		var out recorder
		done := make(chan error, 1)
		go func() {
			_, err := sb.ExecStream(cctx, pandastack.Command{Cmd: "echo started; exec sleep 300", Timeout: pandastack.NoTimeout}, &out, nil)
			done <- err
		}()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out.mu.Lock()
			started := out.buf.Len() > 0
			out.mu.Unlock()
			if started || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
		// The sleep must be gone soon after.
		deadline = time.Now().Add(30 * time.Second)
		for {
			res, err := sb.Exec(ctx, pandastack.Command{Cmd: "ps | grep -c '[s]leep 300' || true"})
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(res.Stdout) == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("sleep 300 still runs 30 s after the stream was closed: %q", res.Stdout)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

func TestIntegrationFiles(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	sb := create(t, c, pandastack.CreateOptions{})

	t.Run("20 MiB round trip", func(t *testing.T) {
		const size = 20 << 20
		up := sha256.New()
		fi, err := sb.WriteFile(ctx, "/work/big/blob.bin", io.TeeReader(guestprototest.PatternReader(1, size), up), 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size != size || fi.Path != "/work/big/blob.bin" || fi.Name != "blob.bin" || fi.Mode != 0o600 || fi.IsDir {
			t.Errorf("got %+v, want the 20 MiB file with mode 0600", fi)
		}
		rc, err := sb.ReadFile(ctx, "/work/big/blob.bin")
		if err != nil {
			t.Fatal(err)
		}
		down := sha256.New()
		n, err := io.Copy(down, rc)
		rc.Close()
		if err != nil || n != size {
			t.Fatalf("read back %d bytes (%v), want %d", n, err, size)
		}
		if !bytes.Equal(up.Sum(nil), down.Sum(nil)) {
			t.Error("the SHA-256 of what was read differs from what was written")
		}
		// And the guest sees the same bytes.
		res, err := sb.Exec(ctx, pandastack.Command{Cmd: "sha256sum /work/big/blob.bin"})
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%x", up.Sum(nil)); !strings.HasPrefix(res.Stdout, want) {
			t.Errorf("guest sha256sum: got %q, want %s", res.Stdout, want)
		}
	})
	t.Run("default mode and empty file", func(t *testing.T) {
		fi, err := sb.WriteFile(ctx, "/work/empty", strings.NewReader(""), 0)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size != 0 || fi.Mode != 0o644 {
			t.Errorf("got %+v, want an empty file with mode 0644", fi)
		}
		fi, err = sb.WriteFile(ctx, "/work/run.sh", strings.NewReader("#!/bin/sh\necho ran\n"), 0o755)
		if err != nil {
			t.Fatal(err)
		}
		res, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"/work/run.sh"}})
		if err != nil || res.Stdout != "ran\n" {
			t.Errorf("got %+v %v, want the uploaded script to run", res, err)
		}
	})
	t.Run("directories", func(t *testing.T) {
		fi, err := sb.Mkdir(ctx, "/work/d1/d2")
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsDir || fi.Path != "/work/d1/d2" {
			t.Errorf("mkdir: got %+v", fi)
		}
		if _, err := sb.WriteFile(ctx, "/work/d1/b.txt", strings.NewReader("bb"), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.WriteFile(ctx, "/work/d1/a.txt", strings.NewReader("a"), 0); err != nil {
			t.Fatal(err)
		}
		entries, err := sb.ListFiles(ctx, "/work/d1")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name)
		}
		if strings.Join(names, ",") != "a.txt,b.txt,d2" || entries[1].Size != 2 || !entries[2].IsDir {
			t.Errorf("got %+v, want a.txt, b.txt, d2 sorted", entries)
		}
		fi, err = sb.Rename(ctx, "/work/d1/a.txt", "/work/d1/d2/moved.txt")
		if err != nil {
			t.Fatal(err)
		}
		if fi.Path != "/work/d1/d2/moved.txt" || fi.Size != 1 {
			t.Errorf("rename: got %+v", fi)
		}
		_, err = sb.Stat(ctx, "/work/d1/a.txt")
		wantErr(t, "stat of a moved file", err, pandastack.ErrNotFound)
		if err := sb.Remove(ctx, "/work/d1", false); err == nil {
			t.Error("removing a non-empty directory without recursive: got no error")
		}
		if err := sb.Remove(ctx, "/work/d1", true); err != nil {
			t.Fatal(err)
		}
		_, err = sb.Stat(ctx, "/work/d1")
		wantErr(t, "stat of a removed directory", err, pandastack.ErrNotFound)
	})
	t.Run("symlink", func(t *testing.T) {
		if _, err := sb.Exec(ctx, pandastack.Command{Cmd: "ln -s /etc/hosts /work/link"}); err != nil {
			t.Fatal(err)
		}
		fi, err := sb.Stat(ctx, "/work/link")
		if err != nil {
			t.Fatal(err)
		}
		if !fi.IsSymlink || fi.LinkTarget != "/etc/hosts" {
			t.Errorf("got %+v, want a symlink to /etc/hosts", fi)
		}
	})
	t.Run("errors", func(t *testing.T) {
		_, err := sb.ReadFile(ctx, "/no/such/file")
		wantErr(t, "read a missing file", err, pandastack.ErrNotFound)
		_, err = sb.ListFiles(ctx, "/no/such/dir")
		wantErr(t, "list a missing directory", err, pandastack.ErrNotFound)
		_, err = sb.WriteFile(ctx, "relative.txt", strings.NewReader("x"), 0)
		wantErr(t, "write a relative path", err, pandastack.ErrInvalid)
		_, err = sb.Stat(ctx, "relative.txt")
		wantErr(t, "stat a relative path", err, pandastack.ErrInvalid)
		err = sb.Remove(ctx, "/no/such/file", false)
		wantErr(t, "remove a missing file", err, pandastack.ErrNotFound)
	})
}

func TestIntegrationTTLAndKill(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	sb := create(t, c, pandastack.CreateOptions{})

	before := time.Now()
	if err := sb.SetTTL(ctx, 120); err != nil {
		t.Fatal(err)
	}
	if d := sb.Info.ExpiresAt.Sub(before); d < 110*time.Second || d > 130*time.Second {
		t.Errorf("after SetTTL(120): expires in %v, want about 120 s", d)
	}
	wantErr(t, "ttl 0", sb.SetTTL(ctx, 0), pandastack.ErrInvalid)
	wantErr(t, "ttl 100 days", sb.SetTTL(ctx, 100*86400), pandastack.ErrInvalid)
	wantErr(t, "ttl of an unknown sandbox", c.Sandbox("nosuchsandbox0").SetTTL(ctx, 60), pandastack.ErrNotFound)

	// Expiry: the sandbox stops on its own.
	if err := sb.SetTTL(ctx, 2); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, c, sb.ID, "expired")
	_, err := sb.Exec(ctx, pandastack.Command{Cmd: "true"})
	wantErr(t, "exec on an expired sandbox", err, pandastack.ErrConflict)
	wantErr(t, "ttl of an expired sandbox", sb.SetTTL(ctx, 60), pandastack.ErrConflict)

	// Kill.
	sb2 := create(t, c, pandastack.CreateOptions{})
	if err := sb2.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, c, sb2.ID, "killed")
	_, err = sb2.Exec(ctx, pandastack.Command{Cmd: "true"})
	wantErr(t, "exec on a killed sandbox", err, pandastack.ErrConflict)
	_, err = sb2.WriteFile(ctx, "/x", strings.NewReader("x"), 0)
	wantErr(t, "write to a killed sandbox", err, pandastack.ErrConflict)
	wantErr(t, "kill of an unknown sandbox", c.Sandbox("nosuchsandbox0").Kill(ctx), pandastack.ErrNotFound)

	// Stopped sandboxes are listed only when asked for.
	all, err := c.List(ctx, pandastack.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hasID(all, sb.ID) || hasID(all, sb2.ID) {
		t.Error("the default list has stopped sandboxes")
	}
	stopped, err := c.List(ctx, pandastack.ListOptions{State: pandastack.StateStopped})
	if err != nil {
		t.Fatal(err)
	}
	if !hasID(stopped, sb.ID) || !hasID(stopped, sb2.ID) {
		t.Error("the list of stopped sandboxes misses the expired or the killed one")
	}
}

// waitStopped waits until the sandbox is stopped for reason.
func waitStopped(t *testing.T, c *pandastack.Client, id, reason string) {
	t.Helper()
	ctx := testCtx(t)
	deadline := time.Now().Add(time.Minute)
	for {
		sb, err := c.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if sb.Info.State == pandastack.StateStopped {
			if sb.Info.StopReason != reason {
				t.Errorf("got stop_reason %q, want %q", sb.Info.StopReason, reason)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s a minute later, want stopped (%s)", id, sb.Info.State, reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func hasID(sbs []*pandastack.Sandbox, id string) bool {
	for _, sb := range sbs {
		if sb.ID == id {
			return true
		}
	}
	return false
}

// TestIntegrationOnExpirePause: with OnExpire "pause" the end of the TTL
// pauses the sandbox, and a resume finds its files.
func TestIntegrationOnExpirePause(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	// A long TTL until the file is written, then 1 s.
	sb := create(t, c, pandastack.CreateOptions{TTLSeconds: 600, OnExpire: "pause"})
	if sb.Info.OnExpire != "pause" {
		t.Errorf("got on_expire %q, want pause", sb.Info.OnExpire)
	}
	if _, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo kept > /root/k"}); err != nil {
		t.Fatal(err)
	}
	if err := sb.SetTTL(ctx, 1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for sb.Info.State != pandastack.StatePaused && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling a condition, bounded by the deadline
		if err := sb.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if sb.Info.State != pandastack.StatePaused {
		t.Fatalf("after its TTL: state %s, want paused", sb.Info.State)
	}
	if err := sb.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	// The resumed sandbox has its 1 s TTL again: give it time to answer.
	if err := sb.SetTTL(ctx, 120); err != nil {
		t.Fatal(err)
	}
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: "cat /root/k"})
	if err != nil || r.Stdout != "kept\n" {
		t.Errorf("after resume: got %q, %v, want kept", r.Stdout, err)
	}
}

// TestIntegrationShell: a Cmd runs under a login bash (bash -l -c) where
// the template has bash (base), else under /bin/sh -c (tiny, busybox); the
// login profiles run, but the variables set explicitly win over them.
func TestIntegrationShell(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	for _, tt := range []struct{ template, cmd, want string }{
		{"base", `echo "$0"; shopt -q login_shell && echo login; [[ a == a ]] && echo bash-syntax`, "/bin/bash\nlogin\nbash-syntax\n"},
		{"tiny", `echo "$0"`, "/bin/sh\n"},
	} {
		sb := create(t, c, pandastack.CreateOptions{Template: tt.template})
		r, err := sb.Exec(ctx, pandastack.Command{Cmd: tt.cmd})
		if err != nil || r.ExitCode != 0 || r.Stdout != tt.want {
			t.Errorf("%s: got %+v, %v, want stdout %q", tt.template, r, err, tt.want)
		}
		// argv-form execs are unchanged.
		r, err = sb.Exec(ctx, pandastack.Command{Argv: []string{"/bin/sh", "-c", `echo "$0"`}})
		if err != nil || r.Stdout != "/bin/sh\n" {
			t.Errorf("%s: argv: got %+v, %v", tt.template, r, err)
		}
		if tt.template != "base" {
			continue
		}
		// user's ~/.profile adds ~/.local/bin once it exists; an explicit
		// PATH comes first, the profiles' entries it lacks after it.
		if r, err := sb.Exec(ctx, pandastack.Command{Cmd: "mkdir -p ~/.local/bin", User: "user"}); err != nil || r.ExitCode != 0 {
			t.Fatalf("mkdir: %+v, %v", r, err)
		}
		r, err = sb.Exec(ctx, pandastack.Command{Cmd: `echo "$PATH"`, User: "user", Env: map[string]string{"PATH": "/opt/x/bin:/usr/bin:/bin"}})
		if want := "/opt/x/bin:/usr/bin:/bin:/home/user/.local/bin:/usr/local/bin:/usr/local/games:/usr/games\n"; err != nil || r.Stdout != want {
			t.Errorf("explicit PATH as user: got %+v, %v, want stdout %q", r, err, want)
		}
	}
}

// TestIntegrationWatchDir: create, write, rename and remove of a file in a
// watched directory arrive as events, in order.
func TestIntegrationWatchDir(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	sb := create(t, c, pandastack.CreateOptions{})
	if _, err := sb.Mkdir(ctx, "/tmp/w"); err != nil {
		t.Fatal(err)
	}
	w, err := sb.StartWatchDir(ctx, "/tmp/w", false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if r, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo a > /tmp/w/f && echo b >> /tmp/w/f && mv /tmp/w/f /tmp/w/g && rm /tmp/w/g"}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", r, err)
	}
	want := []pandastack.WatchEvent{
		{Type: "create", Path: "/tmp/w/f"}, {Type: "write", Path: "/tmp/w/f"},
		{Type: "rename", Path: "/tmp/w/g", OldPath: "/tmp/w/f"}, {Type: "remove", Path: "/tmp/w/g"},
	}
	var got []pandastack.WatchEvent
	for len(got) < len(want) {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		if n := len(got); n > 0 && got[n-1] == ev {
			continue // writes may come as one event or several
		}
		got = append(got, ev)
	}
	if !slices.Equal(got, want) {
		t.Errorf("got events %+v, want %+v", got, want)
	}
	_, err = sb.StartWatchDir(ctx, "/no/such/dir", false)
	wantErr(t, "watch of a missing directory", err, pandastack.ErrNotFound)
}

func TestIntegrationList(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	run := fmt.Sprint(time.Now().UnixNano())
	a := create(t, c, pandastack.CreateOptions{Metadata: map[string]string{"run": run, "role": "a"}})
	b := create(t, c, pandastack.CreateOptions{Metadata: map[string]string{"run": run, "role": "b", "x": "a=b"}})

	tests := []struct {
		name string
		opts pandastack.ListOptions
		want []string
	}{
		{"by run", pandastack.ListOptions{Metadata: map[string]string{"run": run}}, []string{a.ID, b.ID}},
		{"by run and role", pandastack.ListOptions{Metadata: map[string]string{"run": run, "role": "b"}}, []string{b.ID}},
		{"value with =", pandastack.ListOptions{Metadata: map[string]string{"run": run, "x": "a=b"}}, []string{b.ID}},
		{"running", pandastack.ListOptions{State: pandastack.StateRunning, Metadata: map[string]string{"run": run}}, []string{a.ID, b.ID}},
		{"paused", pandastack.ListOptions{State: pandastack.StatePaused, Metadata: map[string]string{"run": run}}, nil},
		{"no match", pandastack.ListOptions{Metadata: map[string]string{"run": run, "role": "c"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sbs, err := c.List(ctx, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, sb := range sbs {
				got = append(got, sb.ID)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v (oldest first)", got, tt.want)
			}
		})
	}
	_, err := c.List(ctx, pandastack.ListOptions{State: "sleeping"})
	wantErr(t, "list with an unknown state", err, pandastack.ErrInvalid)
}

func TestIntegrationErrors(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	_, err := c.Get(ctx, "nosuchsandbox0")
	var e *pandastack.Error
	if !errors.As(err, &e) || e.Status != 404 || e.Code != "not_found" || e.Message == "" {
		t.Errorf("get unknown: got %#v, want a 404 not_found with a message", err)
	}
	_, err = c.Create(ctx, pandastack.CreateOptions{Template: "nosuchtemplate", MemoryMiB: 256})
	wantErr(t, "create from an unknown template", err, pandastack.ErrNotFound)
	_, err = c.Create(ctx, pandastack.CreateOptions{Template: "tiny", MemoryMiB: 256, TTLSeconds: 100 * 86400})
	wantErr(t, "create with a ttl of 100 days", err, pandastack.ErrInvalid)

	_, err = clientWithKey(t, "ps_not_a_key").List(ctx, pandastack.ListOptions{})
	wantErr(t, "unknown key", err, pandastack.ErrUnauthorized)
	_, err = clientWithKey(t, "").List(ctx, pandastack.ListOptions{})
	wantErr(t, "no key", err, pandastack.ErrUnauthorized)

	user, _ := newKey(t, pandastack.Quotas{})
	_, err = user.ListKeys(ctx)
	wantErr(t, "list keys with a user key", err, pandastack.ErrForbidden)
	_, err = user.CreateKey(ctx, "x", true, pandastack.Quotas{})
	wantErr(t, "create a key with a user key", err, pandastack.ErrForbidden)
	_, err = user.BakeTemplate(ctx, "tiny", 256, 1, nil)
	wantErr(t, "bake with a user key", err, pandastack.ErrForbidden)

	// A server that is not there.
	addr, err := pandatest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	gone, err := pandastack.NewClient(pandastack.Options{APIURL: "http://" + addr, APIKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = gone.List(ctx, pandastack.ListOptions{})
	if err == nil || !strings.Contains(err.Error(), "panda up") {
		t.Errorf("got %v, want a hint to run panda up", err)
	}
}

func TestIntegrationKeyIsolation(t *testing.T) {
	ctx := testCtx(t)
	admin := adminClient(t)
	alice, aliceKey := newKey(t, pandastack.Quotas{})
	bob, _ := newKey(t, pandastack.Quotas{})
	sb := create(t, alice, pandastack.CreateOptions{})
	if _, err := sb.WriteFile(ctx, "/work/secret", strings.NewReader("alice"), 0); err != nil {
		t.Fatal(err)
	}

	// Bob sees nothing of Alice's sandbox, exactly as if it did not exist.
	bobs := bob.Sandbox(sb.ID)
	_, err := bob.Get(ctx, sb.ID)
	wantErr(t, "bob get", err, pandastack.ErrNotFound)
	_, err = bobs.Exec(ctx, pandastack.Command{Cmd: "true"})
	wantErr(t, "bob exec", err, pandastack.ErrNotFound)
	_, err = bobs.ExecStream(ctx, pandastack.Command{Cmd: "true"}, nil, nil)
	wantErr(t, "bob exec stream", err, pandastack.ErrNotFound)
	_, err = bobs.ReadFile(ctx, "/work/secret")
	wantErr(t, "bob read file", err, pandastack.ErrNotFound)
	_, err = bobs.WriteFile(ctx, "/work/secret", strings.NewReader("bob"), 0)
	wantErr(t, "bob write file", err, pandastack.ErrNotFound)
	wantErr(t, "bob ttl", bobs.SetTTL(ctx, 60), pandastack.ErrNotFound)
	wantErr(t, "bob kill", bobs.Kill(ctx), pandastack.ErrNotFound)
	list, err := bob.List(ctx, pandastack.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if hasID(list, sb.ID) {
		t.Error("bob's list has alice's sandbox")
	}
	// The admin key is a key like any other for sandboxes.
	_, err = admin.Get(ctx, sb.ID)
	wantErr(t, "admin get of alice's sandbox", err, pandastack.ErrNotFound)

	// Alice's sandbox is untouched.
	list, err = alice.List(ctx, pandastack.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasID(list, sb.ID) {
		t.Error("alice's list misses her sandbox")
	}
	rc, err := sb.ReadFile(ctx, "/work/secret")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "alice" {
		t.Errorf("got %q, want alice's file unchanged", b)
	}

	// Revoking Alice's key kills her sandboxes and locks her out.
	keys, err := admin.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, k := range keys {
		found = found || k.ID == aliceKey.ID
	}
	if !found {
		t.Errorf("ListKeys misses alice's key %s", aliceKey.ID)
	}
	if err := admin.RevokeKey(ctx, aliceKey.ID); err != nil {
		t.Fatal(err)
	}
	_, err = alice.List(ctx, pandastack.ListOptions{})
	wantErr(t, "alice after revoke", err, pandastack.ErrUnauthorized)
	if keys, err = admin.ListKeys(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ID == aliceKey.ID && !k.Revoked {
			t.Errorf("ListKeys shows alice's revoked key %s as active", k.ID)
		}
	}
	wantErr(t, "revoke an unknown key", admin.RevokeKey(ctx, "nosuchkey"), pandastack.ErrNotFound)
}

func TestIntegrationQuota(t *testing.T) {
	ctx := testCtx(t)
	limited, _ := newKey(t, pandastack.Quotas{MaxSandboxes: 1})
	create(t, limited, pandastack.CreateOptions{})
	_, err := limited.Create(ctx, pandastack.CreateOptions{Template: "tiny", MemoryMiB: 256})
	wantErr(t, "second sandbox over a quota of 1", err, pandastack.ErrQuotaExceeded)

	small, _ := newKey(t, pandastack.Quotas{MaxMemoryMiB: 300})
	create(t, small, pandastack.CreateOptions{})
	_, err = small.Create(ctx, pandastack.CreateOptions{Template: "tiny", MemoryMiB: 256})
	wantErr(t, "512 MiB over a quota of 300 MiB", err, pandastack.ErrQuotaExceeded)
}

func TestIntegrationTemplates(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	create(t, c, pandastack.CreateOptions{}) // tiny at 256 MiB is baked by now
	ts, err := c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tp := range ts {
		if tp.Name == "tiny" && tp.MemoryMiB == 256 && tp.State == pandastack.TemplateReady {
			found = true
		}
	}
	if !found {
		t.Errorf("got templates %+v, want tiny at 256 MiB ready", ts)
	}

	var progress []string
	tp, err := c.BakeTemplate(ctx, "tiny", 256, 1, func(m string) { progress = append(progress, m) })
	if err != nil {
		t.Fatal(err)
	}
	if tp.Name != "tiny" || tp.MemoryMiB != 256 || tp.State != pandastack.TemplateReady || tp.BakedAt.IsZero() {
		t.Errorf("got %+v, want tiny at 256 MiB ready", tp)
	}
	if len(progress) == 0 {
		t.Error("got no progress messages")
	}
	// A sandbox from the re-baked template works.
	sb := create(t, c, pandastack.CreateOptions{})
	if res, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo ok"}); err != nil || res.Stdout != "ok\n" {
		t.Errorf("exec after re-bake: got %+v %v", res, err)
	}
	_, err = c.BakeTemplate(ctx, "nosuchtemplate", 256, 1, nil)
	wantErr(t, "bake an unknown template", err, pandastack.ErrNotFound)
}

// A template built from steps (a Dockerfile made in code): the copied
// files, the ENV and the WORKDIR are in its sandboxes.
func TestIntegrationTemplateSteps(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "hello.txt"), []byte("hi from go\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := "sdk-steps-" + strings.ToLower(strconv.FormatInt(time.Now().UnixNano()%1e9, 36))
	t.Cleanup(func() { c.DeleteTemplate(context.Background(), name, true) })
	steps := pandastack.FromImage("tiny").Run("mkdir -p /srv && echo built > /srv/built").
		Copy(src, "/srv/app").Env("GREETING", "hello $world").Workdir("/srv")
	b, err := c.BuildTemplateSteps(ctx, name, steps, nil)
	if err != nil || b.Status != pandastack.BuildSucceeded {
		t.Fatalf("build: %+v, %v", b, err)
	}
	sb := create(t, c, pandastack.CreateOptions{Template: name})
	res, err := sb.Exec(ctx, pandastack.Command{Cmd: `cat built app/hello.txt; echo "$GREETING"; pwd`})
	if want := "built\nhi from go\nhello $world\n/srv\n"; err != nil || res.Stdout != want {
		t.Errorf("sandbox of the steps template: %+v, %v; want %q", res, err, want)
	}
	_, err = c.BuildTemplateSteps(ctx, name, pandastack.FromImage("tiny").Env("1A", "x"), nil)
	wantErr(t, "an invalid step", err, pandastack.ErrInvalid)
}

func TestIntegrationPorts(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	sb := create(t, c, pandastack.CreateOptions{})
	if res, err := sb.Exec(ctx, pandastack.Command{Cmd: "mkdir -p /tmp/www && echo hello from the sandbox > /tmp/www/index.html && httpd -p 8000 -h /tmp/www"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("start a server: %+v, %v", res, err)
	}
	var ports []pandastack.Port
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if ports, err = sb.Ports(ctx); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(ports, func(p pandastack.Port) bool { return p.Port == 8000 }) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if !slices.ContainsFunc(ports, func(p pandastack.Port) bool {
		return p.Port == 8000 && (p.Address == "0.0.0.0" || p.Address == "::")
	}) {
		t.Fatalf("ports: got %+v, want 8000 on every address", ports)
	}

	before := time.Now()
	u, err := sb.URL(ctx, 8000, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(u.URL, testServer(t).URL()+"/p/") || u.ExpiresAt.Before(before.Add(89*time.Second)) || u.ExpiresAt.After(time.Now().Add(92*time.Second)) {
		t.Errorf("url: got %+v, want %s/p/… expiring in 90 s", u, testServer(t).URL())
	}
	// No key: the sandbox's own page (the test server runs with
	// --network off: the guest agent carries the connection).
	res, err := http.Get(u.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || string(b) != "hello from the sandbox\n" {
		t.Errorf("GET %s: got %d %q, want the sandbox's page", u.URL, res.StatusCode, b)
	}
	_, err = sb.URL(ctx, 0, time.Minute)
	wantErr(t, "port 0", err, pandastack.ErrInvalid)
	if err := sb.Kill(ctx); err != nil {
		t.Fatalf("kill: %v", err)
	}
	_, err = sb.URL(ctx, 8000, time.Minute)
	wantErr(t, "url of a killed sandbox", err, pandastack.ErrConflict)
	_, err = sb.Ports(ctx)
	wantErr(t, "ports of a killed sandbox", err, pandastack.ErrConflict)
}

func TestIntegrationNetwork(t *testing.T) {
	c := adminClient(t)
	ctx := testCtx(t)
	_, err := c.Create(ctx, pandastack.CreateOptions{Template: "tiny", MemoryMiB: 256, Network: &pandastack.Network{AllowOut: []string{"pypi.org", "bad entry!"}}})
	if !errors.Is(err, pandastack.ErrBadRequest) || !strings.Contains(err.Error(), `"bad entry!"`) {
		t.Errorf("create with a bad entry: got %v, want ErrBadRequest naming the entry", err)
	}

	sb := create(t, c, pandastack.CreateOptions{Network: &pandastack.Network{AllowOut: []string{"pypi.org", "10.1.0.0/16"}}})
	want := &pandastack.Network{AllowOut: []string{"pypi.org", "10.1.0.0/16"}}
	if !reflect.DeepEqual(sb.Info.Network, want) {
		t.Errorf("create: got network %+v, want %+v", sb.Info.Network, want)
	}
	got, err := c.Get(ctx, sb.ID)
	if err != nil || !reflect.DeepEqual(got.Info.Network, want) {
		t.Errorf("get: got network %+v (%v), want %+v", got.Info.Network, err, want)
	}

	// The fields given replace the current ones, the others stay.
	if err := sb.SetNetwork(ctx, pandastack.NetworkUpdate{Internet: new(true), DenyOut: &[]string{"*.example.com"}}); err != nil {
		t.Fatalf("set network: %v", err)
	}
	want = &pandastack.Network{Internet: true, AllowOut: []string{"pypi.org", "10.1.0.0/16"}, DenyOut: []string{"*.example.com"}}
	if !reflect.DeepEqual(sb.Info.Network, want) {
		t.Errorf("set network: got %+v, want %+v", sb.Info.Network, want)
	}
	err = sb.SetNetwork(ctx, pandastack.NetworkUpdate{DenyOut: &[]string{"example.com", "300.1.2.3/8"}})
	if !errors.Is(err, pandastack.ErrBadRequest) || !strings.Contains(err.Error(), `"300.1.2.3/8"`) {
		t.Errorf("set network with a bad entry: got %v, want ErrBadRequest naming the entry", err)
	}
	if err := sb.Refresh(ctx); err != nil || !reflect.DeepEqual(sb.Info.Network, want) {
		t.Errorf("after a rejected change: got %+v (%v), want the policy unchanged %+v", sb.Info.Network, err, want)
	}
}
