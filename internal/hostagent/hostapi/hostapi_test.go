package hostapi_test

// The tests run one real host agent (QEMU under TCG, the tiny template at
// 256 MiB) behind hostapi.NewServer on an httptest server with the agent's
// TLS credentials (hostapi.LoadOrCreateTLS), and drive it through
// hostclient.Client trusting that CA only, comparing with the same agent used
// locally (agent.Local) where the two must agree.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	stdlog "log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

const testToken = "test-token-0123456789"

var (
	ag       *hostagent.Agent
	local    host.Host // the same agent, as panda up uses it
	client   *hostclient.Client
	hsrv     *hostapi.Server
	hs       *httptest.Server
	creds    *hostapi.AgentTLS
	tlsCfg   *tls.Config  // trusts creds' CA only
	hc       *http.Client // with tlsCfg
	connects atomic.Int32 // Watcher.Connected calls
)

type exit struct {
	id  string
	err error
}

// exits receives Watcher.Exited calls (tests do not run in parallel).
var exits = make(chan exit, 64)

// waitExit waits for the exit of sandbox id, dropping others'.
func waitExit(t *testing.T, id string) error {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case e := <-exits:
			if e.id == id {
				return e.err
			}
		case <-timeout:
			t.Fatalf("no exit event for %s within 30 s", id)
		}
	}
}

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

// panicWatch passes the HTTP server's log on to stderr and notes a panic.
type panicWatch struct{ seen atomic.Bool }

func (p *panicWatch) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("panic")) {
		p.seen.Store(true)
	}
	return os.Stderr.Write(b)
}

// The shared world (the agent, its server, the client following its
// events) is made by world on first use; teardown undoes it after the
// tests, in reverse order.
var (
	setupOnce sync.Once
	setupErr  error
	teardown  []func()
	watch     panicWatch // the HTTP server's own log
)

// runMain runs the tests, then tears down the shared world if a test made
// it. A handler panic (net/http recovers it) fails the run.
func runMain(m *testing.M) int {
	code := m.Run()
	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	if watch.seen.Load() {
		fmt.Fprintln(os.Stderr, "FAIL: the HTTP server logged a panic (above)")
		code = 1
	}
	return code
}

// world gates a test on guest VMs and root and makes the shared world on
// first use.
func world(t *testing.T) {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
	setupOnce.Do(func() { setupErr = setup() })
	if setupErr != nil {
		t.Fatalf("set up the host agent and its server: %v", setupErr)
	}
}

// setup opens the shared agent (QEMU under TCG, the tiny template baked),
// serves it with TLS and connects a client that follows its events.
func setup() error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "ph") // short: unix socket paths under it
	if err != nil {
		return err
	}
	teardown = append(teardown, func() { os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	drv, err := qemu.New(qemu.Config{Logger: log})
	if err != nil {
		return fmt.Errorf("qemu driver: %w", err)
	}
	ag, err = hostagent.Open(ctx, hostagent.Config{
		DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30, Driver: drv,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256,
		OnExit: func(id string, err error) { hsrv.SandboxExited(id, err) },
		Dial:   guestDial, // dial_test.go
		Logger: log,
	})
	if err != nil {
		return fmt.Errorf("open host agent: %w", err)
	}
	teardown = append(teardown, func() { ag.Close() }) // kills what a failed test left running, unmounts the store
	local = hostagent.Local(ag)
	hsrv = hostapi.NewServer(ag, testToken, log)
	if creds, err = hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"}); err != nil {
		return err
	}
	if tlsCfg, err = hostclient.ClientTLS(creds.CAFile); err != nil {
		return err
	}
	hc = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	hs = httptest.NewUnstartedServer(hsrv)
	hs.Config.ErrorLog = stdlog.New(&watch, "http server: ", 0)
	hs.TLS = serverTLS(creds)
	hs.StartTLS()
	teardown = append(teardown, hs.Close)
	teardown = append(teardown, func() { hsrv.Close() }) // before hs.Close: event streams end
	if _, err := ag.Templates().Get(ctx, ag.TemplateParams("tiny", 256, 1), nil); err != nil {
		return fmt.Errorf("bake: %w", err)
	}
	client, err = hostclient.Dial(hs.URL, testToken, hostclient.WithLogger(log), hostclient.WithTLS(tlsCfg))
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	teardown = append(teardown, func() { client.Close() })
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		client.Watch(watchCtx, hostclient.Watcher{
			Connected: func(context.Context) error { connects.Add(1); return nil },
			Exited:    func(id string, err error) { exits <- exit{id, err} },
		})
	}()
	teardown = append(teardown, func() { stopWatch(); <-watchDone })
	if !testkit.Poll(30*time.Second, func() bool { return connects.Load() > 0 }) {
		return errors.New("the event stream never connected")
	}
	return nil
}

// serverTLS is creds' configuration for httptest, which serves a
// certificate of its own unless given one: the agent's current one.
func serverTLS(creds *hostapi.AgentTLS) *tls.Config {
	cfg := creds.Config.Clone()
	c, err := cfg.GetCertificate(nil)
	if err != nil {
		panic(err)
	}
	cfg.Certificates = []tls.Certificate{*c}
	return cfg
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// create makes a sandbox through the client, killed when the test ends.
func create(t *testing.T, h host.Host) host.Info {
	t.Helper()
	info, err := h.Create(ctxT(t), host.CreateRequest{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { ag.Kill(context.Background(), info.ID) })
	return info
}

type execOut struct {
	stdout, stderr string
	res            guestproto.ExecResult
}

// run executes a shell command through h, with stdin if not nil.
func run(t *testing.T, h host.Host, id, cmd string, stdin io.Reader) execOut {
	t.Helper()
	g, err := h.Guest(ctxT(t), id)
	if err != nil {
		t.Fatalf("guest %s: %v", id, err)
	}
	p, err := g.StartExec(ctxT(t), guestproto.ExecRequest{Shell: cmd, Stdin: stdin != nil})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if stdin != nil {
		go func() { io.Copy(p.Stdin(), stdin); p.Stdin().Close() }()
	}
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, p.Stdout()) }()
	go func() { defer wg.Done(); io.Copy(&errOut, p.Stderr()) }()
	wg.Wait()
	res, err := p.Wait()
	if err != nil {
		t.Fatalf("exec %q: wait: %v", cmd, err)
	}
	return execOut{out.String(), errOut.String(), res}
}

func mustRun(t *testing.T, h host.Host, id, cmd string) string {
	t.Helper()
	r := run(t, h, id, cmd, nil)
	if r.res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %q", cmd, r.res.ExitCode, r.stderr)
	}
	return r.stdout
}

func TestLifecycle(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	info := create(t, client)
	if info.State != lifecycle.Running || info.PID == 0 {
		t.Fatalf("create: got state %s pid %d, want running with a VMM", info.State, info.PID)
	}
	got, err := client.Get(ctx, info.ID)
	if err != nil || got.ID != info.ID || got.State != lifecycle.Running {
		t.Fatalf("get: got %+v, %v", got, err)
	}
	list, err := client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !containsID(list, info.ID) {
		t.Errorf("list does not have %s", info.ID)
	}
	if m, err := client.Memory(ctx, info.ID); err != nil || m.RSSBytes == 0 {
		t.Errorf("memory: got %+v, %v; want RSS > 0", m, err)
	}
	if got, want := client.Accel(), ag.Accel(); got != want {
		t.Errorf("accel: got %s, want %s", got, want)
	}
	if got, want := client.TemplateParams("", 0, 0), ag.TemplateParams("", 0, 0); got != want {
		t.Errorf("template params: got %+v, want %+v", got, want)
	}
	if got, want := client.TemplateParams("base", 512, 2), ag.TemplateParams("base", 512, 2); got != want {
		t.Errorf("template params: got %+v, want %+v", got, want)
	}
	// The egress policy of a live sandbox reaches the agent, which checks it.
	if err := client.SetNetwork(ctx, info.ID, netpolicy.Policy{AllowOut: []string{"10.1.0.0/16"}}); err != nil {
		t.Errorf("set network: %v", err)
	}
	if err := client.SetNetwork(ctx, info.ID, netpolicy.Policy{Internet: true, DenyOut: []string{"not an address!"}}); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("set an invalid network: got %v, want host.ErrInvalid", err)
	}
	if err := client.Kill(ctx, info.ID); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := client.SetNetwork(ctx, info.ID, netpolicy.Policy{Internet: true}); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("set network after kill: got %v, want host.ErrNotFound", err)
	}
	if _, err := client.Get(ctx, info.ID); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("get after kill: got %v, want host.ErrNotFound", err)
	}
	if err := client.Kill(ctx, info.ID); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("kill twice: got %v, want host.ErrNotFound", err)
	}
}

func containsID(list []host.Info, id string) bool {
	for _, i := range list {
		if i.ID == id {
			return true
		}
	}
	return false
}

func TestExec(t *testing.T) {
	world(t)
	sb := create(t, client)
	t.Run("output and exit code", func(t *testing.T) {
		r := run(t, client, sb.ID, "echo out; echo err >&2; exit 3", nil)
		if r.stdout != "out\n" || r.stderr != "err\n" || r.res.ExitCode != 3 {
			t.Errorf("got stdout %q stderr %q exit %d; want out, err, 3", r.stdout, r.stderr, r.res.ExitCode)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		data := make([]byte, 3<<20)
		rand.Read(data)
		sum := sha256.Sum256(data)
		r := run(t, client, sb.ID, "sha256sum", bytes.NewReader(data))
		if got, want := strings.Fields(r.stdout + " ")[0], hex.EncodeToString(sum[:]); got != want {
			t.Errorf("sha256 of 3 MiB of stdin in the guest: got %s, want %s", got, want)
		}
	})
	t.Run("large output", func(t *testing.T) {
		r := run(t, client, sb.ID, "head -c 4194304 /dev/urandom > /tmp/big; cat /tmp/big; sha256sum /tmp/big >&2", nil)
		sum := sha256.Sum256([]byte(r.stdout))
		if len(r.stdout) != 4<<20 || !strings.HasPrefix(r.stderr, hex.EncodeToString(sum[:])) {
			t.Errorf("got %d bytes hashing to %x, guest says %q; want 4 MiB and the same hash", len(r.stdout), sum, r.stderr)
		}
	})
	t.Run("full duplex", func(t *testing.T) {
		// An answer to each line before stdin is closed: stdin and
		// output stream at once.
		g, _ := client.Guest(ctxT(t), sb.ID)
		p, err := g.StartExec(ctxT(t), guestproto.ExecRequest{Shell: "while read l; do echo got $l; done", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stderr())
		buf := make([]byte, 64)
		for i := range 3 {
			fmt.Fprintf(p.Stdin(), "line%d\n", i)
			n, err := io.ReadAtLeast(p.Stdout(), buf, len("got lineN\n"))
			if want := fmt.Sprintf("got line%d\n", i); err != nil || string(buf[:n]) != want {
				t.Fatalf("answer %d with stdin open: got %q, %v; want %q", i, buf[:n], err, want)
			}
		}
		p.Stdin().Close()
		io.Copy(io.Discard, p.Stdout())
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Errorf("wait: got %+v, %v; want exit 0", res, err)
		}
	})
	t.Run("exit with stdin open", func(t *testing.T) {
		g, _ := client.Guest(ctxT(t), sb.ID)
		p, err := g.StartExec(ctxT(t), guestproto.ExecRequest{Shell: "exit 7", Stdin: true})
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, p.Stdout())
		io.Copy(io.Discard, p.Stderr())
		if res, err := p.Wait(); err != nil || res.ExitCode != 7 {
			t.Errorf("wait: got %+v, %v; want exit 7", res, err)
		}
		// Writes after the end fail rather than block.
		done := make(chan error, 1)
		go func() {
			_, err := p.Stdin().Write(make([]byte, 1<<20))
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("stdin write after exit: got no error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("stdin write after exit blocked")
		}
	})
	t.Run("cancel kills", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		g, _ := client.Guest(ctxT(t), sb.ID)
		p, err := g.StartExec(ctx, guestproto.ExecRequest{Shell: "echo $$ > /tmp/sleeper.pid; exec sleep 600"})
		if err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stdout())
		go io.Copy(io.Discard, p.Stderr())
		var pid string
		if !testkit.Poll(30*time.Second, func() bool {
			pid = strings.TrimSpace(run(t, local, sb.ID, "cat /tmp/sleeper.pid 2>/dev/null", nil).stdout)
			return pid != ""
		}) {
			t.Fatal("the command never started")
		}
		cancel()
		if _, err := p.Wait(); err == nil {
			t.Errorf("wait after cancel: got no error")
		}
		if !testkit.Poll(30*time.Second, func() bool {
			return run(t, local, sb.ID, "kill -0 "+pid, nil).res.ExitCode != 0
		}) {
			t.Errorf("process %s still runs 30 s after its exec was cancelled", pid)
		}
	})
}

func TestFiles(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	sb := create(t, client)
	g, _ := client.Guest(ctxT(t), sb.ID)
	data := make([]byte, 5<<20+123)
	rand.Read(data)
	want := sha256.Sum256(data)
	n, err := g.WriteFile(ctx, "/root/d/blob", bytes.NewReader(data), 0o640)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("write: got %d, %v; want %d", n, err, len(data))
	}
	rc, fi, err := g.ReadFile(ctx, "/root/d/blob")
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	h := sha256.New()
	_, err = io.Copy(h, rc)
	rc.Close()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want[:]) || fi.Size != int64(len(data)) || fi.Mode&0o777 != 0o640 {
		t.Errorf("read back: sha256 %x size %d mode %o; want %x, %d, 640", got, fi.Size, fi.Mode&0o777, want, len(data))
	}
	if got := mustRun(t, client, sb.ID, "sha256sum /root/d/blob"); !strings.HasPrefix(got, hex.EncodeToString(want[:])) {
		t.Errorf("sha256sum in the guest: got %q, want %x", got, want)
	}
	if err := g.Mkdir(ctx, "/root/d/sub"); err != nil {
		t.Fatal(err)
	}
	if err := g.Rename(ctx, "/root/d/blob", "/root/d/sub/moved"); err != nil {
		t.Fatal(err)
	}
	st, err := g.Stat(ctx, "/root/d/sub/moved")
	if err != nil || st.Size != int64(len(data)) {
		t.Errorf("stat: got %+v, %v", st, err)
	}
	list, err := g.ListDir(ctx, "/root/d")
	if err != nil || len(list) != 1 || list[0].Name != "sub" || !list[0].IsDir {
		t.Errorf("list /root/d: got %+v, %v; want [sub/]", list, err)
	}
	if err := g.Remove(ctx, "/root/d", false); !errors.Is(err, guestproto.ErrNotEmpty) {
		t.Errorf("remove a non-empty dir: got %v, want guestproto.ErrNotEmpty", err)
	}
	if err := g.Remove(ctx, "/root/d", true); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Stat(ctx, "/root/d"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat after remove: got %v, want fs.ErrNotExist", err)
	}
	// A download closed early aborts it; the sandbox carries on.
	mustRun(t, client, sb.ID, "head -c 8388608 /dev/zero > /tmp/zero")
	rc, _, err = g.ReadFile(ctx, "/tmp/zero")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(rc, make([]byte, 4096))
	rc.Close()
	if got := mustRun(t, client, sb.ID, "echo alive"); got != "alive\n" {
		t.Errorf("after an aborted download: got %q", got)
	}
	// An upload whose source fails stores nothing and says why.
	boom := errors.New("source broke")
	_, err = g.WriteFile(ctx, "/root/partial", io.MultiReader(bytes.NewReader(data[:1<<20]), errReader{boom}), 0o644)
	if !errors.Is(err, boom) {
		t.Errorf("upload with a failing source: got %v, want the source's error", err)
	}
	if _, err := g.Stat(ctx, "/root/partial"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stat after a failed upload: got %v, want fs.ErrNotExist", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestErrorsMatchLocal runs failing operations on the agent locally and
// through the client: the errors must have the same text and the same
// classes (what internal/controlplane/rest's classify looks at).
func TestErrorsMatchLocal(t *testing.T) {
	world(t)
	sb := create(t, client)
	paused := create(t, client)
	if _, err := client.Pause(ctxT(t), paused.ID); err != nil {
		t.Fatal(err)
	}
	// A snapshot whose memory no longer matches its checksums.
	corrupt := host.NewID()
	if _, err := ag.Snapshot(ctxT(t), sb.ID, corrupt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.DeleteSnapshot(corrupt) })
	if err := os.WriteFile(filepath.Join(ag.StoreDir(), "snapshots", corrupt, "vm.state"), []byte("not the state"), 0o600); err != nil {
		t.Fatal(err)
	}
	classes := []error{
		host.ErrNotFound, host.ErrConflict, host.ErrInvalid, host.ErrNoSpace, host.ErrCorrupt, host.ErrNotReady,
		templates.ErrNotFound, templates.ErrInvalid, context.DeadlineExceeded,
		guestproto.ErrNotFound, guestproto.ErrExists, guestproto.ErrNotDir, guestproto.ErrIsDir,
		guestproto.ErrNotEmpty, guestproto.ErrPermission, guestproto.ErrInvalid, guestproto.ErrTimeout,
	}
	guestOp := func(id string, op func(g host.Guest) error) func(h host.Host) error {
		return func(h host.Host) error {
			g, err := h.Guest(ctxT(t), id)
			if err != nil {
				return err
			}
			return op(g)
		}
	}
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		op   func(h host.Host) error
		want error
	}{
		{"get unknown", func(h host.Host) error { _, err := h.Get(ctx, "nosuchsandbox"); return err }, host.ErrNotFound},
		{"kill unknown", func(h host.Host) error { return h.Kill(ctx, "nosuchsandbox") }, host.ErrNotFound},
		{"memory unknown", func(h host.Host) error { _, err := h.Memory(ctx, "nosuchsandbox"); return err }, host.ErrNotFound},
		{"create bad id", func(h host.Host) error {
			_, err := h.Create(ctx, host.CreateRequest{ID: "Bad-ID"})
			return err
		}, host.ErrInvalid},
		{"create unknown template", func(h host.Host) error {
			_, err := h.Create(ctx, host.CreateRequest{Template: "nosuchtemplate"})
			return err
		}, host.ErrNotFound},
		{"create too little memory", func(h host.Host) error {
			_, err := h.Create(ctx, host.CreateRequest{MemoryMiB: 1})
			return err
		}, host.ErrInvalid},
		{"create from a corrupt snapshot", func(h host.Host) error {
			_, err := h.Create(ctx, host.CreateRequest{SnapshotID: corrupt})
			return err
		}, host.ErrCorrupt},
		{"create unknown snapshot", func(h host.Host) error {
			_, err := h.Create(ctx, host.CreateRequest{SnapshotID: "nosuchsnapshot"})
			return err
		}, host.ErrNotFound},
		{"lookup unknown template", func(h host.Host) error {
			_, _, err := h.Templates().Lookup(ctx, templates.Params{Name: "nosuchtemplate", MemoryMiB: 256, VCPUs: 1})
			return err
		}, templates.ErrNotFound},
		{"bake invalid", func(h host.Host) error {
			_, err := h.Templates().Bake(ctx, templates.Params{Name: "tiny", MemoryMiB: 1, VCPUs: 1}, nil)
			return err
		}, templates.ErrInvalid},
		{"fork no children", func(h host.Host) error { _, err := h.Fork(ctx, sb.ID, nil); return err }, host.ErrInvalid},
		{"fork paused", func(h host.Host) error { _, err := h.Fork(ctx, paused.ID, []string{"child1"}); return err }, host.ErrConflict},
		{"pause paused", func(h host.Host) error { _, err := h.Pause(ctx, paused.ID); return err }, host.ErrConflict},
		{"resume running", func(h host.Host) error { _, err := h.Resume(ctx, sb.ID); return err }, host.ErrConflict},
		{"snapshot bad id", func(h host.Host) error { _, err := h.Snapshot(ctx, sb.ID, "Bad-ID"); return err }, host.ErrInvalid},
		{"delete unknown snapshot", func(h host.Host) error { return h.DeleteSnapshot(ctx, "nosuchsnapshot") }, host.ErrNotFound},
		{"exec in paused", guestOp(paused.ID, func(g host.Guest) error {
			_, err := g.StartExec(ctx, guestproto.ExecRequest{Shell: "true"})
			return err
		}), host.ErrConflict},
		{"stat in unknown", guestOp("nosuchsandbox", func(g host.Guest) error { _, err := g.Stat(ctx, "/"); return err }), host.ErrNotFound},
		{"exec missing program", guestOp(sb.ID, func(g host.Guest) error {
			_, err := g.StartExec(ctx, guestproto.ExecRequest{Argv: []string{"/no/such/program"}})
			return err
		}), guestproto.ErrNotFound},
		{"exec invalid", guestOp(sb.ID, func(g host.Guest) error {
			_, err := g.StartExec(ctx, guestproto.ExecRequest{})
			return err
		}), guestproto.ErrInvalid},
		{"stat missing", guestOp(sb.ID, func(g host.Guest) error { _, err := g.Stat(ctx, "/no/such/file"); return err }), guestproto.ErrNotFound},
		{"read a directory", guestOp(sb.ID, func(g host.Guest) error {
			rc, _, err := g.ReadFile(ctx, "/etc")
			if err == nil {
				rc.Close()
			}
			return err
		}), guestproto.ErrIsDir},
		{"list a file", guestOp(sb.ID, func(g host.Guest) error { _, err := g.ListDir(ctx, "/etc/passwd"); return err }), guestproto.ErrNotDir},
		{"mkdir relative", guestOp(sb.ID, func(g host.Guest) error { return g.Mkdir(ctx, "relative") }), guestproto.ErrInvalid},
		{"write over a directory", guestOp(sb.ID, func(g host.Guest) error {
			_, err := g.WriteFile(ctx, "/etc", strings.NewReader("x"), 0o644)
			return err
		}), guestproto.ErrIsDir},
		{"rename missing", guestOp(sb.ID, func(g host.Guest) error { return g.Rename(ctx, "/no/such", "/tmp/x") }), guestproto.ErrNotFound},
		{"remove missing", guestOp(sb.ID, func(g host.Guest) error { return g.Remove(ctx, "/no/such", false) }), guestproto.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lerr, rerr := tc.op(local), tc.op(client)
			if lerr == nil || rerr == nil {
				t.Fatalf("got local %v, remote %v; want errors", lerr, rerr)
			}
			if !errors.Is(rerr, tc.want) {
				t.Errorf("remote error %q is not %v", rerr, tc.want)
			}
			if lerr.Error() != rerr.Error() {
				t.Errorf("error text: local %q, remote %q", lerr, rerr)
			}
			for _, c := range classes {
				if errors.Is(lerr, c) != errors.Is(rerr, c) {
					t.Errorf("errors.Is(_, %v): local %v, remote %v (%q)", c, errors.Is(lerr, c), errors.Is(rerr, c), rerr)
				}
			}
			var lge, rge *guestproto.Error
			if errors.As(lerr, &lge) != errors.As(rerr, &rge) || (lge != nil && *lge != *rge) {
				t.Errorf("guest error: local %+v, remote %+v", lge, rge)
			}
		})
	}
}

func TestForkSnapshotPauseResume(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	parent := create(t, client)
	mustRun(t, client, parent.ID, "echo from-parent > /root/mark")
	ids := []string{host.NewID(), host.NewID()}
	for _, id := range ids {
		t.Cleanup(func() { ag.Kill(context.Background(), id) })
	}
	res, err := client.Fork(ctx, parent.ID, ids)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(res.Children) != 2 || res.Capture.Paused <= 0 || res.Capture.PausedMS <= 0 {
		t.Fatalf("fork: got %d children, paused %v (%v ms); want 2 and a pause", len(res.Children), res.Capture.Paused, res.Capture.PausedMS)
	}
	for i, c := range res.Children {
		if c.Err != nil || c.Info.ID != ids[i] || c.Info.ParentID != parent.ID {
			t.Fatalf("child %d: got %+v, %v", i, c.Info, c.Err)
		}
		if got := mustRun(t, client, c.Info.ID, "cat /root/mark"); got != "from-parent\n" {
			t.Errorf("child %s sees %q, want the parent's file", c.Info.ID, got)
		}
	}
	// A child that cannot start is reported in its slot.
	dup, err := client.Fork(ctx, parent.ID, []string{ids[0]})
	if err != nil || len(dup.Children) != 1 || !errors.Is(dup.Children[0].Err, host.ErrConflict) {
		t.Errorf("fork into a used id: got %+v, %v; want the child's error host.ErrConflict", dup, err)
	}

	snapID := host.NewID()
	si, err := client.Snapshot(ctx, parent.ID, snapID)
	if err != nil || si.ID != snapID || si.SandboxID != parent.ID || si.SizeBytes <= 0 {
		t.Fatalf("snapshot: got %+v, %v", si, err)
	}
	t.Cleanup(func() { ag.DeleteSnapshot(snapID) })
	// The server records a snapshot a crash left unrecorded from this list.
	if list, err := client.Snapshots(ctx); err != nil || !slices.ContainsFunc(list, func(x host.SnapshotInfo) bool {
		return x.ID == snapID && x.SandboxID == parent.ID && x.SizeBytes == si.SizeBytes
	}) {
		t.Errorf("snapshots: got %+v, %v; want %s of %s among them", list, err, snapID, parent.ID)
	}
	restored, err := client.Create(ctx, host.CreateRequest{SnapshotID: snapID})
	if err != nil {
		t.Fatalf("create from snapshot: %v", err)
	}
	t.Cleanup(func() { ag.Kill(context.Background(), restored.ID) })
	if restored.Snapshot != snapID {
		t.Errorf("created from snapshot: got snapshot_id %q, want %q", restored.Snapshot, snapID)
	}
	if got := mustRun(t, client, restored.ID, "cat /root/mark"); got != "from-parent\n" {
		t.Errorf("sandbox from the snapshot sees %q", got)
	}
	if err := client.DeleteSnapshot(ctx, snapID); err != nil {
		t.Errorf("delete snapshot: %v", err)
	}

	st, err := client.Pause(ctx, parent.ID)
	if err != nil || st.Paused <= 0 {
		t.Fatalf("pause: got %+v, %v", st, err)
	}
	// Where the paused sandbox is kept travels too (this agent has no
	// object store: only on its disk).
	if info, _ := client.Get(ctx, parent.ID); info.State != lifecycle.Paused || info.Stored != host.StoredLocal || info.StoreError != "" {
		t.Errorf("after pause: state %s, stored %q, store error %q; want paused, %q, none", info.State, info.Stored, info.StoreError, host.StoredLocal)
	}
	if list, _ := client.List(ctx); !slices.ContainsFunc(list, func(in host.Info) bool { return in.ID == parent.ID && in.Stored == host.StoredLocal }) {
		t.Errorf("list after pause: %+v; want %s stored %q", list, parent.ID, host.StoredLocal)
	}
	info, err := client.Resume(ctx, parent.ID)
	if err != nil || info.State != lifecycle.Running {
		t.Fatalf("resume: got %+v, %v", info, err)
	}
	if got := mustRun(t, client, parent.ID, "cat /root/mark"); got != "from-parent\n" {
		t.Errorf("after resume: got %q", got)
	}
}

func TestTemplates(t *testing.T) {
	world(t)
	lt, err := ag.Templates().List()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := client.Templates().List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(lt) == 0 || len(lt) != len(rt) || lt[0].Key() != rt[0].Key() || !lt[0].BakedAt.Equal(rt[0].BakedAt) {
		t.Errorf("list: local %+v, remote %+v", lt, rt)
	}
	names, err := client.Templates().Names(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names, ","), strings.Join(ag.Templates().Names(), ","); got != want || got == "" {
		t.Errorf("names: got %q, want %q", got, want)
	}
	p := ag.TemplateParams("tiny", 256, 1)
	ltm, lr, lerr := ag.Templates().Lookup(p)
	rtm, rr, rerr := client.Templates().Lookup(ctxT(t), p)
	if lerr != nil || rerr != nil || lr != rr || ltm == nil || rtm == nil || ltm.Key() != rtm.Key() || !ltm.BakedAt.Equal(rtm.BakedAt) || ltm.Inputs["rootfs"] != rtm.Inputs["rootfs"] {
		t.Errorf("lookup: local %+v %q %v, remote %+v %q %v", ltm, lr, lerr, rtm, rr, rerr)
	}
	if testing.Short() {
		t.Skip("bake: skipped with -short")
	}
	var progress []string
	bp := templates.Params{Name: "tiny", MemoryMiB: 128, VCPUs: 1}
	tm, err := client.Templates().Bake(ctxT(t), bp, func(m string) { progress = append(progress, m) })
	if err != nil {
		t.Fatalf("bake: %v", err)
	}
	if tm.Key() != bp.Key() || len(progress) == 0 {
		t.Errorf("bake: got %s with progress %q; want %s and progress lines", tm.Key(), progress, bp.Key())
	}
	if _, reason, err := client.Templates().Lookup(ctxT(t), bp); err != nil || reason != "" {
		t.Errorf("lookup after bake: stale %q, %v; want fresh", reason, err)
	}
}

// TestVMMExit: a VMM killed behind the agent's back reaches the client's
// Watcher as an exit of that sandbox.
func TestVMMExit(t *testing.T) {
	world(t)
	sb := create(t, client)
	if err := unix.Kill(sb.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := waitExit(t, sb.ID); errors.Is(err, host.ErrHostShutdown) {
		t.Errorf("exit cause %v: not a host shutdown", err)
	}
	if _, err := client.Get(ctxT(t), sb.ID); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("get after the VMM died: got %v, want host.ErrNotFound", err)
	}
}

// TestWatchReconnects: when the stream breaks the client reconnects and
// calls Connected again.
func TestWatchReconnects(t *testing.T) {
	world(t)
	before := connects.Load()
	hs.CloseClientConnections()
	if !testkit.Poll(30*time.Second, func() bool { return connects.Load() > before }) {
		t.Fatalf("Connected not called again within 30 s of the stream breaking")
	}
	// Events flow on the new stream.
	sb := create(t, client)
	unix.Kill(sb.PID, unix.SIGKILL)
	waitExit(t, sb.ID)
}

func TestAuth(t *testing.T) {
	world(t)
	if _, err := hostclient.Dial(hs.URL, "wrong-token", hostclient.WithTLS(tlsCfg)); !errors.Is(err, hostwire.ErrUnauthorized) {
		t.Errorf("dial with a wrong token: got %v, want hostwire.ErrUnauthorized", err)
	}
	for _, h := range []string{"", "Bearer ", "Bearer wrong", "Basic " + testToken, testToken, "Bearer " + testToken + "x", "Bearer " + testToken[:len(testToken)-1]} {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+hostwire.Prefix+"/sandboxes", nil)
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), `"code":"unauthorized"`) {
			t.Errorf("Authorization %q: got %d %s, want 401 unauthorized", h, res.StatusCode, body)
		}
	}
	// An endpoint the agent does not have (a server of another version):
	// 501 unsupported, whether the path or only the method is unknown.
	for _, m := range []string{http.MethodGet + " /nothing", http.MethodPut + " /sandboxes/abc"} {
		method, path, _ := strings.Cut(m, " ")
		req, _ := http.NewRequest(method, hs.URL+hostwire.Prefix+path, nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), `"code":"unsupported"`) || !strings.Contains(string(body), "no endpoint "+method) {
			t.Errorf("%s: got %d %s, want 501 unsupported naming the endpoint", m, res.StatusCode, body)
		}
	}
	res, err := hc.Get(hs.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz without a token: got %d, want 200", res.StatusCode)
	}
	// In clear, the TLS server answers nothing but an error.
	plain := "http://" + strings.TrimPrefix(hs.URL, "https://")
	if _, err := hostclient.Dial(plain, testToken); err == nil {
		t.Errorf("dial %s (no TLS) of a TLS agent: got no error", plain)
	}
	_, err = hostclient.Dial("http://127.0.0.1:1", testToken)
	var ue *host.UnreachableError
	if !errors.Is(err, host.ErrUnavailable) || !errors.As(err, &ue) || !strings.HasPrefix(ue.Addr, "http://127.0.0.1:1/") {
		t.Errorf("dial nothing: got %v, want a host.UnreachableError (host.ErrUnavailable) naming the address", err)
	}
}

// secondServer serves another host API on the test agent (configured by
// set, if not nil, before it serves) and returns it with a client of it;
// the client, the server and its HTTP server end with the test, in that
// order.
func secondServer(t *testing.T, set func(*hostapi.Server)) (*hostapi.Server, *hostclient.Client) {
	t.Helper()
	s2, c2, _ := secondServerNoting(t, set, "")
	return s2, c2
}

// secondServerNoting is secondServer whose requests are noted: the
// channel it returns is closed when a request whose path ends in suffix
// reaches the server. A test waits on it for a request to be in flight on
// the server instead of sleeping.
func secondServerNoting(t *testing.T, set func(*hostapi.Server), suffix string) (*hostapi.Server, *hostclient.Client, <-chan struct{}) {
	t.Helper()
	s2 := hostapi.NewServer(ag, testToken, nil)
	if set != nil {
		set(s2)
	}
	arrived := make(chan struct{})
	var once sync.Once
	hs2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if suffix != "" && strings.HasSuffix(r.URL.Path, suffix) {
			once.Do(func() { close(arrived) })
		}
		s2.ServeHTTP(w, r)
	}))
	t.Cleanup(hs2.Close)
	t.Cleanup(func() { s2.Close() })
	c2, err := hostclient.Dial(hs2.URL, testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	return s2, c2, arrived
}

// inFlight waits until arrived (of secondServerNoting) is closed: the
// request is on the server.
func inFlight(t *testing.T, arrived <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-arrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s never reached the server", what)
	}
}

// TestShutdown: a server that shuts down refuses new requests, still
// sends exit events until Close, and then ends its streams.
func TestShutdown(t *testing.T) {
	world(t)
	s2 := hostapi.NewServer(ag, testToken, nil)
	hs2 := httptest.NewServer(s2)
	defer hs2.Close()
	defer s2.Close()
	c2, err := hostclient.Dial(hs2.URL, testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got := make(chan error, 1)
	connected := make(chan struct{}, 8)
	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		c2.Watch(ctx, hostclient.Watcher{
			Connected: func(context.Context) error { connected <- struct{}{}; return nil },
			Exited:    func(id string, err error) { got <- err },
		})
	}()
	defer func() { cancel(); <-watchDone }()
	select {
	case <-connected:
	case <-time.After(30 * time.Second):
		t.Fatal("not connected")
	}
	if err := s2.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.List(context.Background()); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("request after Shutdown: got %v, want host.ErrUnavailable", err)
	}
	s2.SandboxExited("somesandbox", host.ErrHostShutdown)
	select {
	case err := <-got:
		if !errors.Is(err, host.ErrHostShutdown) {
			t.Errorf("exit cause: got %v, want host.ErrHostShutdown", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit event after Shutdown")
	}
	s2.Close()
	// The stream ends; reconnecting is refused.
	req, _ := http.NewRequest(http.MethodGet, hs2.URL+hostwire.Prefix+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("events after Close: got %d, want 503", res.StatusCode)
	}
}

func TestToken(t *testing.T) {
	path := t.TempDir() + "/agent.token"
	tok, created, err := hostapi.LoadOrCreateToken(path)
	if err != nil || !created || len(tok) < 32 {
		t.Fatalf("first start: got %q, created %v, %v; want a new random token", tok, created, err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("token file: %v, %v; want mode 600", st, err)
	}
	again, created, err := hostapi.LoadOrCreateToken(path)
	if err != nil || created || again != tok {
		t.Errorf("second start: got %q, created %v, %v; want %q again", again, created, err, tok)
	}
	if got, err := hostwire.ReadToken(path); err != nil || got != tok {
		t.Errorf("read: got %q, %v; want %q", got, err, tok)
	}
	os.WriteFile(path, []byte(" \n"), 0o600)
	if _, _, err := hostapi.LoadOrCreateToken(path); err == nil {
		t.Errorf("empty token file: got no error")
	}
	if _, err := hostwire.ReadToken(path + ".missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing token file: got %v, want fs.ErrNotExist", err)
	}
}

// TestDownloadCutShort: a download whose guest dies midway ends with an
// error, never with a short file and EOF.
func TestDownloadCutShort(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	sb := create(t, client)
	mustRun(t, client, sb.ID, "head -c 16777216 /dev/zero > /tmp/big")
	g, _ := client.Guest(ctxT(t), sb.ID)
	rc, fi, err := g.ReadFile(ctx, "/tmp/big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	unix.Kill(sb.PID, unix.SIGKILL)
	n, err := io.Copy(io.Discard, rc)
	t.Logf("download cut short after %d more bytes: %v", n, err)
	if err == nil {
		t.Errorf("download of a sandbox killed midway: got %d of %d more bytes and no error", n, fi.Size-1<<20)
	}
	waitExit(t, sb.ID)
}

// TestShutdownDeliversQueuedExits: a shutting-down agent can wait for a
// control plane to follow its events, and every exit it reports before
// Close reaches that control plane, however many are queued.
func TestShutdownDeliversQueuedExits(t *testing.T) {
	world(t)
	const n = 200
	s2, got := shutdownExits(t, n, nil)
	for i := range n {
		s2.SandboxExited(fmt.Sprintf("sb%d", i), host.ErrHostShutdown)
	}
	s2.Close()
	awaitExits(t, got, n, "exits reported before Close reached the client")
}

// TestReconcileRefusedKeepsExits: a control plane whose reconcile on
// connect fails (the agent began shutting down meanwhile) still takes the
// exits already on that stream — the host_shutdown exits of the
// sandboxes the agent stops — before it drops the stream.
func TestReconcileRefusedKeepsExits(t *testing.T) {
	world(t)
	const n = 20
	refuse := make(chan struct{})
	first := true
	s2, got := shutdownExits(t, n, func(context.Context) error {
		if !first {
			return nil
		}
		first = false
		<-refuse
		return errors.New("host agent unavailable: the host agent is shutting down")
	})
	// The agent shuts down: it sends the exits of what it stops on the
	// stream it saw subscribe, while the client's reconcile is refused.
	for i := range n {
		s2.SandboxExited(fmt.Sprintf("sb%d", i), host.ErrHostShutdown)
	}
	close(refuse)
	s2.Close()
	awaitExits(t, got, n, "shutdown exits reached a client whose reconcile was refused")
}

// shutdownExits serves the test agent with a host API server of its own
// and follows its events with a client (its Watcher's Connected:
// connected) until the test ends; it returns the server, once the client
// has subscribed, and the ids of the host_shutdown exits the client gets
// (room for n).
func shutdownExits(t *testing.T, n int, connected func(context.Context) error) (*hostapi.Server, <-chan string) {
	t.Helper()
	s2 := hostapi.NewServer(ag, testToken, nil)
	hs2 := httptest.NewServer(s2)
	t.Cleanup(hs2.Close)
	t.Cleanup(func() { s2.Close() })
	nobody, cancel0 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel0()
	if s2.WaitSubscriber(nobody) {
		t.Fatal("WaitSubscriber with no client: true")
	}
	c2, err := hostclient.Dial(hs2.URL, testToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	got := make(chan string, n)
	ctx, cancel := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		c2.Watch(ctx, hostclient.Watcher{Connected: connected, Exited: func(id string, err error) {
			if errors.Is(err, host.ErrHostShutdown) {
				got <- id
			}
		}})
	}()
	t.Cleanup(func() { cancel(); <-watchDone })
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if !s2.WaitSubscriber(wctx) {
		t.Fatal("WaitSubscriber: the client never subscribed")
	}
	return s2, got
}

// awaitExits waits for n ids on got.
func awaitExits(t *testing.T, got <-chan string, n int, what string) {
	t.Helper()
	for i := range n {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d %s", i, n, what)
		}
	}
}
