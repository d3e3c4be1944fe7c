package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// ExecOptions configures ExecBench.
type ExecOptions struct {
	Template  string // "" lets the server choose
	MemoryMiB int    // 0 lets the server choose
	// APIKey is sent on the terminal WebSocket (the SDK's client does not
	// hand its key out).
	APIKey string
	// N is the number of measurements of each kind (keystrokes are capped
	// at 4000: the terminal's line holds 4095 bytes).
	N   int
	Log io.Writer
}

// ExecResult is the output of `panda bench exec`.
type ExecResult struct {
	APIURL    string `json:"api_url"`
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	// KeystrokeEcho is a key sent on the terminal WebSocket until its echo
	// comes back on it (the terminal's own echo, in canonical mode).
	KeystrokeEcho Dist `json:"keystroke_echo"`
	// StartToFirstByte is POST …/processes of `echo x` until the first
	// output byte on GET …/output.
	StartToFirstByte Dist `json:"start_to_first_byte"`
	// AttachToFirstByte is GET …/output?from=start of a process that has
	// output until its first byte.
	AttachToFirstByte Dist `json:"attach_to_first_byte"`
	// Shells is the exec round trip (POST …/exec until its answer) of
	// `true` in each way a command can be run (execShells), interleaved.
	Shells []ShellDist `json:"exec_shells"`
	// E2B compares E2B's JS SDK with the Go SDK (E2BBench); filled by the
	// caller, nil if not asked for.
	E2B *E2BResult `json:"e2b,omitempty"`
}

// ShellDist is the exec round trip of one way of running a command.
type ShellDist struct {
	Name string `json:"name"`
	Dist
}

// execShells are the ways of running `true` that ExecResult.Shells
// compares: what a login shell costs over a plain one (docs/api.md,
// "Which shell runs cmd").
var execShells = []struct {
	name string
	cmd  pandastack.Command
}{
	{"argv [/bin/sh -c true]", pandastack.Command{Argv: []string{"/bin/sh", "-c", "true"}}},
	{"argv [/bin/bash -c true]", pandastack.Command{Argv: []string{"/bin/bash", "-c", "true"}}},
	{"cmd true (bash -l -c)", pandastack.Command{Cmd: "true"}},
	{"cmd true as user", pandastack.Command{Cmd: "true", User: "user"}},
	{"cmd true, env PATH", pandastack.Command{Cmd: "true", Env: map[string]string{"PATH": "/opt/x/bin:/usr/bin:/bin"}}},
}

var errFirstByte = errors.New("first byte")

// ExecBench measures interactive latencies through the REST API of a
// running server, in one sandbox it creates (labelled and killed before
// it returns, as APIBench's).
func ExecBench(ctx context.Context, c *pandastack.Client, o ExecOptions) (res ExecResult, err error) {
	logf := logTo(o.Log)
	res = ExecResult{APIURL: c.APIURL(), Template: o.Template, MemoryMiB: o.MemoryMiB}
	run := &apiRun{c: c, label: map[string]string{"panda_bench": runID()}, opts: APIOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, TTLSeconds: 900}, ids: map[string]bool{}}
	defer func() {
		if cerr := run.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	sb, _, err := run.create(ctx)
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	res.Template, res.MemoryMiB = sb.Info.Template, sb.Info.MemoryMiB
	if err := run.firstExec(ctx, sb); err != nil {
		return res, fmt.Errorf("first exec in %s: %w", sb.ID, err)
	}

	logf("keystroke → echo over the terminal WebSocket")
	d, err := keystrokes(ctx, sb, c.APIURL(), o.APIKey, min(o.N, 4000))
	if err != nil {
		return res, fmt.Errorf("keystrokes: %w", err)
	}
	res.KeystrokeEcho = d

	logf("background start → first output byte")
	var starts []time.Duration
	for i := range o.N + 3 {
		t0 := time.Now()
		p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo x"})
		if err != nil {
			return res, fmt.Errorf("start: %w", err)
		}
		if err := firstByte(ctx, p); err != nil {
			return res, err
		}
		if i >= 3 { // warm-up
			starts = append(starts, time.Since(t0))
		}
		if err := p.Kill(ctx); err != nil {
			return res, fmt.Errorf("remove process: %w", err)
		}
	}
	res.StartToFirstByte = Summarize(starts)

	logf("attach → first output byte")
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo x; exec sleep 1000"})
	if err != nil {
		return res, fmt.Errorf("start: %w", err)
	}
	var attaches []time.Duration
	for i := range o.N + 3 {
		t0 := time.Now()
		if err := firstByte(ctx, p); err != nil {
			return res, err
		}
		if i >= 3 {
			attaches = append(attaches, time.Since(t0))
		}
	}
	res.AttachToFirstByte = Summarize(attaches)
	if err := p.Kill(ctx); err != nil {
		return res, fmt.Errorf("remove process: %w", err)
	}

	logf("exec round trip of true: sh, bash, login bash")
	if res.Shells, err = shellRoundTrips(ctx, sb, o.N); err != nil {
		return res, err
	}
	return res, nil
}

// shellRoundTrips measures each of execShells n times, in rotating order
// (after one warm-up round). A template without bash or without the user
// `user` fails the bash forms: those are left out, with what they said.
func shellRoundTrips(ctx context.Context, sb *pandastack.Sandbox, n int) ([]ShellDist, error) {
	var forms []int
	for i, f := range execShells {
		r, err := sb.Exec(ctx, f.cmd)
		switch {
		case err == nil && r.ExitCode == 0:
			forms = append(forms, i)
		case i == 0:
			return nil, fmt.Errorf("exec %s: %+v, %v", f.name, r, err)
		}
	}
	samples := make([][]time.Duration, len(execShells))
	for k := range n {
		for j := range forms {
			f := forms[(j+k)%len(forms)]
			t0 := time.Now()
			r, err := sb.Exec(ctx, execShells[f].cmd)
			if err != nil || r.ExitCode != 0 {
				return nil, fmt.Errorf("exec %s: %+v, %v", execShells[f].name, r, err)
			}
			samples[f] = append(samples[f], time.Since(t0))
		}
	}
	out := make([]ShellDist, 0, len(forms))
	for _, f := range forms {
		out = append(out, ShellDist{Name: execShells[f].name, Dist: Summarize(samples[f])})
	}
	return out, nil
}

// firstByte follows p's output from the start until its first byte.
func firstByte(ctx context.Context, p *pandastack.Process) error {
	_, err := p.Output(ctx, pandastack.FromStart, func(c pandastack.OutputChunk) error {
		if len(c.Data) > 0 {
			return errFirstByte
		}
		return nil
	})
	if !errors.Is(err, errFirstByte) {
		return fmt.Errorf("output of process %d ended without a byte: %v", p.PID, err)
	}
	return nil
}

// keystrokes measures n keystroke → echo round trips of a `cat` on a
// terminal, over the WebSocket.
func keystrokes(ctx context.Context, sb *pandastack.Sandbox, apiURL, key string, n int) (Dist, error) {
	p, err := sb.StartProcess(ctx, pandastack.Command{Cmd: "echo ready; exec cat", PTY: &pandastack.PTYSize{Rows: 24, Cols: 80}})
	if err != nil {
		return Dist{}, err
	}
	defer p.Kill(context.WithoutCancel(ctx))
	u, err := url.Parse(strings.TrimRight(apiURL, "/"))
	if err != nil {
		return Dist{}, err
	}
	u.Scheme = map[string]string{"http": "ws", "https": "wss"}[u.Scheme]
	u.Path += "/v1/sandboxes/" + url.PathEscape(sb.ID) + "/processes/" + strconv.Itoa(p.PID) + "/tty"
	conn, _, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		return Dist{}, fmt.Errorf("dial %s: %w", u, err)
	}
	defer conn.CloseNow()
	readUntil := func(want string) error {
		var got strings.Builder
		for !strings.Contains(got.String(), want) {
			typ, b, err := conn.Read(ctx)
			if err != nil {
				return fmt.Errorf("read %q so far, want %q: %w", got.String(), want, err)
			}
			if typ == websocket.MessageBinary {
				got.Write(b)
			}
		}
		return nil
	}
	if err := readUntil("ready\r\n"); err != nil {
		return Dist{}, err
	}
	var ds []time.Duration
	for i := range n + 5 {
		// Letters in turn, so that each echo is told from the last.
		k := string(rune('a' + i%26))
		t0 := time.Now()
		if err := conn.Write(ctx, websocket.MessageBinary, []byte(k)); err != nil {
			return Dist{}, err
		}
		if err := readUntil(k); err != nil {
			return Dist{}, err
		}
		if i >= 5 {
			ds = append(ds, time.Since(t0))
		}
	}
	return Summarize(ds), nil
}
