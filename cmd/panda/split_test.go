package main

// End-to-end tests of `panda agent` and `panda server` run as two
// processes, used through the Go SDK. Same environment, helpers and
// clean-up as e2e_test.go.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"golang.org/x/sys/unix"
)

// agentOptions is `panda agent` on dataDir at addr ("" for a free port)
// with the tiny defaults and extra flags.
func agentOptions(dataDir, addr string, extra ...string) pandatest.Options {
	return pandatest.Options{Command: "agent", DataDir: dataDir, Addr: addr, Args: append(slices.Clone(tinyDefaults), extra...)}
}

// serverOptions is `panda server` on dataDir against the agent at
// agentURL, with extra flags.
func serverOptions(dataDir, agentURL string, extra ...string) pandatest.Options {
	return pandatest.Options{Command: "server", DataDir: dataDir, Args: append([]string{"--agent", agentURL}, extra...)}
}

// stopAgentClean stops an agent on dir with --on-shutdown kill, and checks
// that it left no VMM and unmounted its store.
func stopAgentClean(t *testing.T, ag *proc, dir string) {
	t.Helper()
	mustStop(t, ag)
	if pids := testkit.QEMUProcs(dir); len(pids) != 0 {
		t.Errorf("QEMU processes after the agent's graceful stop: got %v, want none", pids)
	}
	if store := filepath.Join(dir, "store"); testkit.Mounted(store) {
		t.Errorf("%s is still mounted after the agent's graceful stop", store)
	}
}

// waitStopped polls until sandbox id is stopped and returns its record.
func waitStopped(t *testing.T, ctx context.Context, c *pandastack.Client, id string) pandastack.SandboxInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		info := mustGet(t, ctx, c, id)
		if info.State == pandastack.StateStopped {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still %s a minute later, want stopped", id, info.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSplitServerAgent: the control plane and a host agent as two
// processes, each on its own data directory. Create, exec (stdin, streamed
// output), files, fork and kill work through the public API; a VMM that
// dies is recorded; the server restarts without touching the sandboxes;
// the agent's shutdown kills them and the server records why.
func TestSplitServerAgent(t *testing.T) {
	e2e(t)
	agentDir, serverDir := newDataDir(t), newDataDir(t)
	ctx := ctxFor(t)
	ag := start(t, "agent", agentOptions(agentDir, ""))
	tokenFile, caFile := filepath.Join(agentDir, "agent.token"), filepath.Join(agentDir, "agent-ca.pem")
	// The agent's credentials, each in its data directory with its mode.
	for name, mode := range map[string]os.FileMode{
		"agent.token": 0o600, "agent-ca.pem": 0o644, "agent-ca-key.pem": 0o600, "agent-cert.pem": 0o644, "agent-key.pem": 0o600,
	} {
		if st, err := os.Stat(filepath.Join(agentDir, name)); err != nil || st.Mode().Perm() != mode {
			t.Errorf("agent's %s: %v, %v; want mode %o", name, st, err, mode)
		}
	}
	// The output is read from the agent's pipe as it comes: its lines may
	// land a little after the agent answers its health check.
	says := func(out string) bool {
		return strings.Contains(out, tokenFile) && strings.Contains(out, "Created the agent's CA in "+caFile) &&
			strings.Contains(out, "listening on https://")
	}
	if !testkit.Poll(10*time.Second, func() bool { return says(ag.Stdout()) }) {
		t.Errorf("agent output does not name the token file %s and the CA %s, listening on https:\n%s", tokenFile, caFile, ag.Stdout())
	}
	creds := []string{"--agent-token-file", tokenFile, "--agent-ca-file", caFile}

	// Servers that cannot trust or be trusted stop at once and say why:
	// a wrong token, another agent's CA, plain HTTP.
	badToken := filepath.Join(serverDir, "bad.token")
	os.WriteFile(badToken, []byte("wrong\n"), 0o600)
	otherCA, err := hostapi.LoadOrCreateTLS(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts pandatest.Options
		want string
	}{
		{"a wrong agent token", serverOptions(serverDir, ag.URL(), "--agent-token-file", badToken, "--agent-ca-file", caFile), "rejected the token"},
		{"another agent's CA", serverOptions(serverDir, ag.URL(), "--agent-token-file", tokenFile, "--agent-ca-file", otherCA.CAFile), "not trusted"},
		{"no CA file", serverOptions(serverDir, ag.URL(), "--agent-token-file", tokenFile), "agent-ca.pem"},
		{"http://", serverOptions(serverDir, strings.Replace(ag.URL(), "https://", "http://", 1), creds...), "TLS only"},
	} {
		if out, err := runToEnd(t, ctx, tc.opts); err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("server with %s: got %v, want a failure saying %q; output:\n%s", tc.name, err, tc.want, out)
		}
	}

	sv := start(t, "server", serverOptions(serverDir, ag.URL(), creds...))
	c := sv.client(t)
	parent := mustCreate(t, ctx, c)
	writeFile(t, ctx, parent, "/root/mark", "parent\n")
	r, err := parent.Exec(ctx, pandastack.Command{Cmd: "cat; echo done >&2; exit 3", Stdin: "from stdin"})
	if err != nil || r.Stdout != "from stdin" || r.Stderr != "done\n" || r.ExitCode != 3 {
		t.Errorf("exec with stdin: got %+v, %v; want stdout %q, stderr %q, exit 3", r, err, "from stdin", "done\n")
	}
	var out, errOut bytes.Buffer
	sr, err := parent.ExecStream(ctx, pandastack.Command{Cmd: "for i in 1 2 3; do echo $i; done; echo e >&2"}, &out, &errOut)
	if err != nil || sr.ExitCode != 0 || out.String() != "1\n2\n3\n" || errOut.String() != "e\n" {
		t.Errorf("streamed exec: got %+v, %v, stdout %q, stderr %q", sr, err, out.String(), errOut.String())
	}
	splitProcessesAndWatch(t, ctx, sv, parent)
	if hosts, err := c.Hosts(ctx); err != nil || len(hosts) != 1 || hosts[0].State != "ready" || hosts[0].Accel != "tcg" ||
		hosts[0].Sandboxes != 1 || hosts[0].VCPUs < 1 || hosts[0].MemoryMiB < 1 {
		t.Errorf("hosts: got %+v, %v; want one ready tcg host with one sandbox, its CPUs and memory", hosts, err)
	}

	kids, err := parent.Fork(ctx, 2)
	if err != nil || len(kids) != 2 {
		t.Fatalf("fork: got %d children, %v", len(kids), err)
	}
	for _, k := range kids {
		if got := mustExec(t, ctx, k, "cat /root/mark"); got != "parent\n" {
			t.Errorf("child %s sees %q, want the parent's file", k.ID, got)
		}
	}
	// A VMM that dies reaches the catalog through the event stream.
	if err := unix.Kill(vmmPID(t, agentDir, kids[0].ID), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if info := waitStopped(t, ctx, c, kids[0].ID); info.StopReason != "vmm_exited" {
		t.Errorf("child whose VMM died: got stop_reason %q, want vmm_exited", info.StopReason)
	}
	if err := kids[1].Kill(ctx); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if info := mustGet(t, ctx, c, kids[1].ID); info.State != pandastack.StateStopped || info.StopReason != "killed" {
		t.Errorf("killed child: got %s (%s), want stopped (killed)", info.State, info.StopReason)
	}
	if pids := testkit.QEMUProcs(agentDir); len(pids) != 1 {
		t.Errorf("QEMU processes with one sandbox left: got %v", pids)
	}

	// The server's restart leaves the agent's sandboxes alone.
	pid := vmmPID(t, agentDir, parent.ID)
	mustStop(t, sv)
	if !testkit.Alive(pid) {
		t.Fatalf("the VMM of %s died with the server", parent.ID)
	}
	sv2 := start(t, "server2", serverOptions(serverDir, ag.URL(), creds...))
	c = sv2.client(t)
	if got := mustExec(t, ctx, c.Sandbox(parent.ID), "cat /root/mark"); got != "parent\n" {
		t.Errorf("after the server's restart: got %q", got)
	}

	// The agent's shutdown kills its sandboxes and tells the server.
	stopAgentClean(t, ag, agentDir)
	if info := waitStopped(t, ctx, c, parent.ID); info.StopReason != "host_shutdown" {
		t.Errorf("sandbox of a stopped agent: got stop_reason %q, want host_shutdown", info.StopReason)
	}
	// No agent: what needs it is unavailable (503), the rest works.
	if _, err := c.Create(ctx, pandastack.CreateOptions{}); !errors.Is(err, pandastack.ErrUnavailable) {
		t.Errorf("create without an agent: got %v, want ErrUnavailable", err)
	}
	if _, err := c.List(ctx, pandastack.ListOptions{}); err != nil {
		t.Errorf("list without an agent: %v", err)
	}
	if hosts, err := c.Hosts(ctx); err != nil || len(hosts) != 1 || hosts[0].State != "unreachable" {
		t.Errorf("hosts without an agent: got %+v, %v; want one, unreachable", hosts, err)
	}
	mustStop(t, sv2)
}

// TestSplitAgentRestart: agent and server share one data directory (and
// the default token file). The agent stops with --on-shutdown keep; while
// it is down one VMM dies; the restarted agent adopts the survivor, the
// server reconnects by itself, keeps the survivor and records the loss.
func TestSplitAgentRestart(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	agentAddr, err := pandatest.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	ag := start(t, "agent", agentOptions(dir, agentAddr, "--on-shutdown", "keep"))
	sv := start(t, "server", serverOptions(dir, ag.URL()))
	c := sv.client(t)
	keep, lost := mustCreate(t, ctx, c), mustCreate(t, ctx, c)
	writeFile(t, ctx, keep, "/root/kept.txt", "kept\n")
	keepPID, lostPID := vmmPID(t, dir, keep.ID), vmmPID(t, dir, lost.ID)

	if !mustStop(t, ag) {
		t.FailNow()
	}
	if !testkit.Alive(keepPID) || !testkit.Alive(lostPID) {
		t.Fatalf("VMMs after the agent stopped with --on-shutdown keep: alive %v, %v; want both", testkit.Alive(keepPID), testkit.Alive(lostPID))
	}
	if _, err := keep.Exec(ctx, pandastack.Command{Cmd: "true"}); !errors.Is(err, pandastack.ErrUnavailable) {
		t.Errorf("exec while the agent is down: got %v, want ErrUnavailable", err)
	}
	unix.Kill(lostPID, unix.SIGKILL)
	if !testkit.WaitGone(lostPID, 10*time.Second) {
		t.Fatalf("VMM %d alive 10 s after SIGKILL", lostPID)
	}

	ag2 := start(t, "agent2", agentOptions(dir, agentAddr))
	// The server reconnects on its own (backoff up to 5 s) and reconciles.
	if info := waitStopped(t, ctx, c, lost.ID); info.StopReason != "vmm_exited" {
		t.Errorf("sandbox whose VMM died while the agent was down: got stop_reason %q, want vmm_exited", info.StopReason)
	}
	if info := mustGet(t, ctx, c, keep.ID); info.State != pandastack.StateRunning {
		t.Errorf("survivor: got %s (%s), want running", info.State, info.StopReason)
	}
	if got := mustExec(t, ctx, keep, "cat /root/kept.txt"); got != "kept\n" {
		t.Errorf("survivor's file: got %q, want %q", got, "kept\n")
	}
	if pids := testkit.QEMUProcs(dir); len(pids) != 1 || pids[0] != keepPID {
		t.Errorf("QEMU processes: got %v, want [%d]", pids, keepPID)
	}
	mustStop(t, sv)
	stopAgentClean(t, ag2, dir)
}

// TestSplitTimeoutsAndLongRequests: server and agent with short HTTP
// timeouts (a config file). Clients that send nothing, send their headers
// or body too slowly, or leave a keep-alive connection idle are cut off, on
// the REST API and on the host API (TLS); long exec streams, a slow upload
// and the event stream live on past every timeout, and so do a background
// process's output stream, its wait and a directory watch. An exec whose command
// is far beyond the host API's old 4 KiB line goes through the REST API
// and the host API end to end. (The pauses here are a slow client's.)
func TestSplitTimeoutsAndLongRequests(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	const header, idle, body = time.Second, 2 * time.Second, time.Second
	conf := filepath.Join(dir, "timeouts.yaml")
	os.WriteFile(conf, []byte("http_read_header_timeout: 1s\nhttp_idle_timeout: 2s\nhttp_body_read_timeout: 1s\n"), 0o644)
	ag := start(t, "agent", agentOptions(dir, "", "--config", conf))
	sv := start(t, "server", serverOptions(dir, ag.URL(), "--config", conf))
	c := sv.client(t)
	sb := mustCreate(t, ctx, c)
	restAddr := strings.TrimPrefix(sv.URL(), "http://")
	agentAddr := strings.TrimPrefix(ag.URL(), "https://")

	// Long command lines, through the REST API and the host API.
	long := func(n int) pandastack.Command {
		return pandastack.Command{Cmd: "X='" + strings.Repeat("a", n) + "'; echo ${#X}"}
	}
	if r, err := sb.Exec(ctx, long(60<<10)); err != nil || r.Stdout != fmt.Sprintln(60<<10) || r.ExitCode != 0 {
		t.Errorf("exec of a 60 KiB command: got %+v, %v; want its length back", r, err)
	}
	// 100 KiB: what the guest protocol allows, as with panda up. The
	// host API is not the limit.
	r, err := sb.Exec(ctx, long(100<<10))
	if guestproto.MaxPayload > 100<<10+256 {
		if err != nil || r.Stdout != fmt.Sprintln(100<<10) {
			t.Errorf("exec of a 100 KiB command: got %+v, %v; want its length back", r, err)
		}
	} else if apiErr := (*pandastack.Error)(nil); !errors.As(err, &apiErr) || apiErr.Status != 422 ||
		!strings.Contains(apiErr.Message, fmt.Sprintf("exceeds %d", guestproto.MaxPayload)) {
		t.Errorf("exec of a 100 KiB command: got %+v, %v; want the guest protocol's own 422 (exceeds %d), as panda up answers", r, err, guestproto.MaxPayload)
	}

	// Silent connections, on both APIs (the agent's before the TLS
	// handshake).
	for _, addr := range []string{restAddr, agentAddr} {
		conn := dialRaw(t, addr)
		if d := closedAfter(t, conn); d < header/2 {
			t.Errorf("%s: a silent connection closed after %v, before the header timeout %v", addr, d, header)
		}
	}
	// Headers sent too slowly.
	conn := dialRaw(t, restAddr)
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	go func() {
		for i := range 100 {
			if _, err := fmt.Fprintf(conn, "X-%d: y\r\n", i); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	if d := closedAfter(t, conn); d > 5*time.Second {
		t.Errorf("headers trickled for %v before the connection closed, want about %v", d, header)
	}
	// Idle keep-alive connections, on both APIs.
	agentTLS, err := hostclient.ClientTLS(filepath.Join(dir, "agent-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		tls  *tls.Config
	}{{restAddr, nil}, {agentAddr, agentTLS}} {
		conn := dialRaw(t, tc.addr)
		if tc.tls != nil {
			cfg := tc.tls.Clone()
			cfg.ServerName = "127.0.0.1"
			conn = tls.Client(conn, cfg)
		}
		io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || res.StatusCode != 200 || res.Close {
			t.Fatalf("%s: GET /healthz: %v, %v; want 200, kept alive", tc.addr, res, err)
		}
		io.Copy(io.Discard, res.Body)
		if d := closedAfter(t, conn); d < idle*3/4 {
			t.Errorf("%s: an idle connection closed after %v, before the idle timeout %v", tc.addr, d, idle)
		}
	}
	// A body that stops coming.
	conn = dialRaw(t, restAddr)
	fmt.Fprintf(conn, "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tem", sv.AdminKey())
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || res.StatusCode != http.StatusBadRequest {
		t.Errorf("a stalled request body: got %v, %v; want 400 after about %v", res, err, body)
	}

	// What must live on: an exec stream quiet for longer than every
	// timeout between its lines ...
	var out bytes.Buffer
	er, err := sb.ExecStream(ctx, pandastack.Command{Cmd: "for i in 1 2 3; do echo $i; sleep 2.5; done"}, &out, io.Discard)
	if err != nil || er.ExitCode != 0 || out.String() != "1\n2\n3\n" {
		t.Errorf("a 7.5 s exec stream: got %+v, %v, %q; want 1 2 3", er, err, out.String())
	}
	// ... a background process's output stream, a wait and a directory
	// watch, all quiet for 5 s (past the idle and body timeouts) ...
	mustExec(t, ctx, sb, "mkdir -p /root/quiet")
	qw, err := sb.StartWatchDir(ctx, "/root/quiet", false)
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer qw.Close()
	qp, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo a; sleep 5; echo b; touch /root/quiet/f"})
	if err != nil {
		t.Fatalf("start a quiet process: %v", err)
	}
	waited := make(chan error, 1)
	go func() {
		info, err := qp.Wait(ctx)
		if err == nil && (info.ExitCode == nil || *info.ExitCode != 0) {
			err = fmt.Errorf("got %+v, want exit 0", info)
		}
		waited <- err
	}()
	var qout strings.Builder
	if res, err := qp.Output(ctx, pandastack.FromStart, func(c pandastack.OutputChunk) error {
		qout.WriteString(c.Data)
		return nil
	}); err != nil || res.ExitCode != 0 || qout.String() != "a\nb\n" {
		t.Errorf("a quiet 5 s output stream: got %+v, %v, %q; want a b", res, err, qout.String())
	}
	if err := <-waited; err != nil {
		t.Errorf("a 5 s wait: %v", err)
	}
	if ev, err := qw.Next(); err != nil || ev.Path != "/root/quiet/f" {
		t.Errorf("a watch quiet for 5 s: got %+v, %v; want an event on /root/quiet/f", ev, err)
	}
	// ... an upload that pauses under the body timeout, for 4 s in all ...
	pr, pw := io.Pipe()
	go func() {
		for i := range 8 {
			fmt.Fprintf(pw, "chunk %d\n", i)
			time.Sleep(body / 2)
		}
		pw.Close()
	}()
	if _, err := sb.WriteFile(ctx, "/root/slow.txt", pr, 0o644); err != nil {
		t.Errorf("slow upload: %v", err)
	} else if got := mustExec(t, ctx, sb, "wc -l < /root/slow.txt"); got != "8\n" {
		t.Errorf("slow upload: the file has %q lines, want 8", got)
	}
	// ... and the agent's event stream (quiet between its pings): a VMM
	// that dies now still reaches the catalog.
	if strings.Contains(sv.Log(), "event stream lost") {
		t.Errorf("the server lost the agent's event stream:\n%s", sv.Log())
	}
	other := mustCreate(t, ctx, c)
	unix.Kill(vmmPID(t, dir, other.ID), unix.SIGKILL)
	if info := waitStopped(t, ctx, c, other.ID); info.StopReason != "vmm_exited" {
		t.Errorf("sandbox whose VMM died: got stop_reason %q, want vmm_exited", info.StopReason)
	}
	mustStop(t, sv)
	stopAgentClean(t, ag, dir)
}

// dialRaw opens a TCP connection to addr, closed when the test ends.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closedAfter reads conn until the server closes it and returns how long
// that took; the test fails if it is still open 30 s later.
func closedAfter(t *testing.T, conn net.Conn) time.Duration {
	t.Helper()
	t0 := time.Now()
	conn.SetReadDeadline(t0.Add(30 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection to %s still open 30 s later", conn.RemoteAddr())
	}
	return time.Since(t0)
}

// TestSplitSnapshotRecordedAfterACrash: with panda server and panda agent,
// a server crash after the agent took a snapshot but before the catalog
// recorded it used to leave the snapshot on the agent forever, listed
// nowhere (found by panda chaos): the host API had no list of snapshots
// to reconcile with. The restarted server records it for the key that owns
// its sandbox, and sandboxes can be created from it.
func TestSplitSnapshotRecordedAfterACrash(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	ag := start(t, "agent", agentOptions(dir, ""))
	opts := serverOptions(dir, ag.URL())
	opts.Env = []string{"PANDA_FAILPOINTS=api-snapshot-taken=crash"}
	sv := start(t, "server crashing at api-snapshot-taken", opts)
	c := sv.client(t)
	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/note.txt", "snapshotted\n")
	mustCrash(t, sv, "snapshot", func() error { _, err := sb.Snapshot(ctx, ""); return err })

	sv2 := start(t, "server", serverOptions(dir, ag.URL()))
	c = sv2.client(t)
	snaps, err := c.Snapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].SandboxID != sb.ID {
		t.Fatalf("after a crash between snapshot and record: snapshots %+v, %v; want one of %s", snaps, err, sb.ID)
	}
	child, err := c.Create(ctx, pandastack.CreateOptions{SnapshotID: snaps[0].ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create from the recovered snapshot: %v", err)
	}
	if got := mustExec(t, ctx, child, "cat /root/note.txt"); got != "snapshotted\n" {
		t.Errorf("sandbox from the recovered snapshot: file %q, want %q", got, "snapshotted\n")
	}
	mustStop(t, sv2)
	stopAgentClean(t, ag, dir)
}

// splitProcessesAndWatch: background processes (output streamed from an
// offset, stdin, wait, signal, the WebSocket terminal) and a directory
// watch work through a server whose host is remote. It leaves no process
// behind.
func splitProcessesAndWatch(t *testing.T, ctx context.Context, sv *proc, sb *pandastack.Sandbox) {
	t.Helper()
	// Watch first: the events of what the processes below do.
	mustExec(t, ctx, sb, "mkdir -p /tmp/split-w")
	w, err := sb.StartWatchDir(ctx, "/tmp/split-w", true)
	if err != nil {
		t.Fatalf("watch a directory in split mode: %v", err)
	}
	defer w.Close()

	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo ready; while read l; do echo got $l; echo $l > /tmp/split-w/$l; done; echo bye >&2; exit 4", OpenStdin: true})
	if err != nil {
		t.Fatalf("start a background process in split mode: %v", err)
	}
	var mu sync.Mutex
	var out, errOut strings.Builder
	outDone := make(chan error, 1)
	go func() {
		res, err := p.Output(ctx, pandastack.FromStart, func(c pandastack.OutputChunk) error {
			mu.Lock()
			defer mu.Unlock()
			if c.Stderr {
				errOut.WriteString(c.Data)
			} else {
				out.WriteString(c.Data)
			}
			return nil
		})
		if err == nil && res.ExitCode != 4 {
			err = fmt.Errorf("exit %d, want 4", res.ExitCode)
		}
		outDone <- err
	}()
	if err := p.WriteStdin(ctx, []byte("one\ntwo\n")); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	// The watch sees the file the process made.
	ev, err := w.Next()
	if err != nil || ev.Type != pandastack.WatchCreate || ev.Path != "/tmp/split-w/one" {
		t.Errorf("first watch event: got %+v, %v; want create /tmp/split-w/one", ev, err)
	}
	if err := p.CloseStdin(ctx); err != nil {
		t.Fatalf("close stdin: %v", err)
	}
	info, err := p.Wait(ctx)
	if err != nil || info.State != "exited" || info.ExitCode == nil || *info.ExitCode != 4 {
		t.Errorf("wait: got %+v, %v; want exited with 4", info, err)
	}
	if err := <-outDone; err != nil {
		t.Errorf("output stream: %v", err)
	}
	mu.Lock()
	if out.String() != "ready\ngot one\ngot two\n" || errOut.String() != "bye\n" {
		t.Errorf("streamed output: got stdout %q stderr %q", out.String(), errOut.String())
	}
	mu.Unlock()
	// From an offset: what follows "ready\n".
	var tail strings.Builder
	if _, err := p.Output(ctx, int64(len("ready\n")), func(c pandastack.OutputChunk) error {
		if !c.Stderr {
			tail.WriteString(c.Data)
		}
		return nil
	}); err != nil || tail.String() != "got one\ngot two\n" {
		t.Errorf("output from offset 6: got %q, %v", tail.String(), err)
	}
	if list, err := sb.Processes(ctx); err != nil || len(list) != 1 || list[0].PID != p.PID {
		t.Errorf("processes: got %+v, %v; want the one", list, err)
	}
	if err := p.Kill(ctx); err != nil {
		t.Errorf("remove the process: %v", err)
	}

	// A signal ends a wait.
	sl, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "sleep 600"})
	if err != nil {
		t.Fatal(err)
	}
	if err := sl.Signal(ctx, "TERM"); err != nil {
		t.Errorf("signal: %v", err)
	}
	if info, err := sl.Wait(ctx); err != nil || info.Signal == "" {
		t.Errorf("wait for a signalled process: got %+v, %v", info, err)
	}
	sl.Kill(ctx)

	// The terminal: a WebSocket on a PTY process.
	tp, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "read l; echo got-$l; stty size", PTY: &pandastack.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatalf("start a terminal: %v", err)
	}
	if err := tp.Resize(ctx, 30, 100); err != nil {
		t.Errorf("resize: %v", err)
	}
	url := "ws" + strings.TrimPrefix(sv.URL(), "http") + "/v1/sandboxes/" + sb.ID + "/processes/" + fmt.Sprint(tp.PID) + "/tty"
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + sv.AdminKey()}}, Subprotocols: []string{"pandastack.v1"},
	})
	if err != nil {
		t.Fatalf("tty websocket: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageBinary, []byte("x\r")); err != nil {
		t.Fatalf("tty write: %v", err)
	}
	var screen strings.Builder
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("tty read: %v; screen so far %q", err, screen.String())
		}
		if typ == websocket.MessageBinary {
			screen.Write(b)
			continue
		}
		if !strings.Contains(string(b), `"exit"`) {
			t.Errorf("tty control frame: got %s, want exit", b)
		}
		break
	}
	if !strings.Contains(screen.String(), "got-x") || !strings.Contains(screen.String(), "30 100") {
		t.Errorf("tty screen: got %q, want got-x and the size 30 100", screen.String())
	}
	tp.Kill(ctx)

	// Removing the directory ends the watch.
	mustExec(t, ctx, sb, "rm -rf /tmp/split-w")
	for {
		if _, err := w.Next(); err != nil {
			if err != io.EOF {
				t.Errorf("watch of a removed directory: got %v, want io.EOF", err)
			}
			break
		}
	}
}

// TestSplitTemplateBuild: `panda server --agent` builds templates on its
// agent, whose store keeps them: a Dockerfile build whose context the
// server streams to the agent, its log followed, listed, created from (its
// sandbox sees the context's file and its RUN's output), published, and
// deleted.
func TestSplitTemplateBuild(t *testing.T) {
	e2e(t)
	agentDir, serverDir := newDataDir(t), newDataDir(t)
	ctx := ctxFor(t)
	ag := start(t, "agent", agentOptions(agentDir, ""))
	sv := start(t, "server", serverOptions(serverDir, ag.URL(),
		"--agent-token-file", filepath.Join(agentDir, "agent.token"), "--agent-ca-file", filepath.Join(agentDir, "agent-ca.pem")))
	c := sv.client(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("from the context\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var lines []string
	b, err := c.BuildTemplateFromDockerfile(ctx, "remote", "FROM tiny\nCOPY hello.txt /hello.txt\nRUN echo built > /built\n", dir,
		func(l string) { lines = append(lines, l) })
	log := strings.Join(lines, "\n")
	if err != nil || b.Status != pandastack.BuildSucceeded || b.Version != 1 || !strings.Contains(log, "RUN echo built") {
		t.Fatalf("build on the agent: %+v, %v; log:\n%s", b, err, log)
	}
	if list, err := c.TemplateBuilds(ctx, "remote"); err != nil || len(list) != 1 || list[0].ID != b.ID || list[0].Status != pandastack.BuildSucceeded {
		t.Errorf("builds of remote: %+v, %v; want the one that succeeded", list, err)
	}
	listed := false
	if ts, err := c.Templates(ctx); err == nil {
		for _, tp := range ts {
			listed = listed || (tp.Name == "remote" && tp.LatestVersion == 1)
		}
	}
	if !listed {
		t.Errorf("template remote (version 1) not listed")
	}
	sb, err := c.Create(ctx, pandastack.CreateOptions{Template: "remote", MemoryMiB: 256, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create from the template built on the agent: %v", err)
	}
	if got := mustExec(t, ctx, sb, "cat /hello.txt /built"); got != "from the context\nbuilt\n" {
		t.Errorf("the template's sandbox sees %q", got)
	}
	if err := c.PublishTemplate(ctx, "remote", true); err != nil {
		t.Errorf("publish: %v", err)
	}
	if err := c.DeleteTemplate(ctx, "remote", false); !errors.Is(err, pandastack.ErrConflict) {
		t.Errorf("delete of a template a sandbox runs: %v, want conflict", err)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "remote", false); err != nil {
		t.Errorf("delete: %v", err)
	}
	if _, err := c.Create(ctx, pandastack.CreateOptions{Template: "remote", MemoryMiB: 256}); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("create from the deleted template: %v, want not found", err)
	}
	mustStop(t, sv)
	stopAgentClean(t, ag, agentDir)
}
