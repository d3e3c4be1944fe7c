package guestproto_test

// Fuzz targets of the guest protocol, in both directions. Each input runs
// in milliseconds and deterministically; the seed corpora are in
// testdata/fuzz. Run one for longer with
//
//	go test -run='^$' -fuzz='^FuzzClientRead$' -fuzztime=60s ./internal/guestproto/

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
)

// fuzzBound is how long one input may take before it counts as a hang.
const fuzzBound = 10 * time.Second

// Client operations FuzzClientRead runs, chosen by the input's op byte.
const (
	fuzzHello = iota // the guest's bytes come before any HELLO_ACK
	fuzzStat
	fuzzList
	fuzzRead
	fuzzExec
	fuzzWrite
	fuzzBarrier
	fuzzPing
	fuzzDial
	fuzzVolumes
	fuzzOps
)

// fuzzClientConfig keeps the limits small, so that inputs reach them.
var fuzzClientConfig = guestproto.ClientConfig{
	WriteTimeout:   fuzzBound,
	CallTimeout:    fuzzBound,
	MaxStreams:     4,
	MaxListEntries: 8,
	MaxListBytes:   2048,
}

// FuzzClientRead: the host Client reads whatever a guest sends while it
// runs one operation (on stream 1), then the guest hangs up. Nothing may
// panic or hang, and what the operation returns stays within the limits.
func FuzzClientRead(f *testing.F) {
	f.Add(byte(fuzzStat), []byte{})
	f.Fuzz(func(t *testing.T, op byte, guest []byte) {
		op %= fuzzOps
		hostEnd, guestEnd := net.Pipe()
		c, err := guestproto.NewClientConfig(hostEnd, fuzzClientConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		defer guestEnd.Close()

		// The guest: its reader answers HELLO (unless the input is to
		// come first) and says when the operation's first frame arrived;
		// its writer then sends the input and hangs up.
		send := make(chan struct{})
		go func() {
			defer close(send)
			for {
				fr, err := guestproto.ReadFrame(guestEnd)
				if err != nil {
					return
				}
				switch {
				case fr.Type == guestproto.FrameHello && op == fuzzHello:
					return
				case fr.Type == guestproto.FrameHello:
					b, _ := json.Marshal(guestproto.HelloReply{Session: "fuzz", Features: []string{guestproto.FeatureDial, guestproto.FeatureVolumes}})
					_ = guestproto.WriteFrame(guestEnd, guestproto.Frame{Type: guestproto.FrameHelloAck, Payload: b})
				case fr.Type == guestproto.FrameOpen, fr.Type == guestproto.FrameBarrier, fr.Type == guestproto.FramePing:
					return
				}
			}
		}()
		go func() {
			<-send
			go io.Copy(io.Discard, guestEnd) // whatever the host still writes
			_, _ = guestEnd.Write(guest)
			_ = guestEnd.Close()
		}()

		ctx, cancel := context.WithTimeout(context.Background(), fuzzBound)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := c.Hello(ctx, guestproto.HelloRequest{Session: "fuzz"}); err != nil {
				return
			}
			fuzzClientOp(t, ctx, c, op)
		}()
		select {
		case <-done:
		case <-time.After(fuzzBound):
			t.Fatalf("operation %d did not return within %v", op, fuzzBound)
		}
	})
}

func fuzzClientOp(t *testing.T, ctx context.Context, c *guestproto.Client, op byte) {
	switch op {
	case fuzzHello:
		// Hello succeeded on a HELLO_ACK of session "fuzz" in the input.
		_ = c.Ping(ctx)
	case fuzzStat:
		_, _ = c.Stat(ctx, "/x")
	case fuzzList:
		list, err := c.ListDir(ctx, "/x")
		if err == nil && len(list) > fuzzClientConfig.MaxListEntries {
			t.Fatalf("ListDir returned %d entries, over the limit of %d", len(list), fuzzClientConfig.MaxListEntries)
		}
		if code := guestproto.CodeOf(err); err != nil && code == "" && !errors.Is(err, guestproto.ErrClosed) {
			t.Fatalf("ListDir failed with %v: neither a guest error nor a closed connection", err)
		}
	case fuzzRead:
		rc, _, err := c.ReadFile(ctx, "/x")
		if err == nil {
			_, _ = io.Copy(io.Discard, rc)
			rc.Close()
		}
	case fuzzExec:
		_, _ = c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"x"}}, nil, io.Discard, io.Discard)
	case fuzzWrite:
		_, _ = c.WriteFile(ctx, "/x", guestprototest.PatternReader(1, 300<<10), 0o644)
	case fuzzBarrier:
		if c.Barrier(ctx) == nil {
			_ = c.Resume(ctx)
		}
	case fuzzPing:
		_ = c.Ping(ctx)
	case fuzzDial:
		conn, err := c.DialPort(ctx, 8080)
		if err != nil {
			return
		}
		defer conn.Close()
		// The guest hangs up after its input: nothing here waits for the
		// deadline but a bug.
		_ = conn.SetDeadline(time.Now().Add(fuzzBound))
		_, _ = conn.Write([]byte("request"))
		_, _ = io.Copy(io.Discard, conn)
		_ = conn.(interface{ CloseWrite() error }).CloseWrite()
	case fuzzVolumes:
		conn, err := c.OpenVolumes(ctx, []guestproto.VolumeMount{{Tag: "v", Path: "/mnt/v"}})
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(fuzzBound))
		_, _ = conn.Write([]byte("request"))
		_, _ = io.Copy(io.Discard, conn)
	}
}

// echoHandler serves every stream by echoing it (a dial with ServeConn,
// to an echo server); it never blocks once the stream is aborted.
type echoHandler struct{}

func (echoHandler) Hello(context.Context, *guestproto.HelloRequest) guestproto.HelloReply {
	return guestproto.HelloReply{AgentVersion: "fuzz"}
}

func (echoHandler) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	if req.Op == guestproto.OpDial || req.Op == guestproto.OpVolumes {
		// The guest's side of a dial (or a volume stream: a byte pipe
		// too), to an echo server over a pipe.
		conn, server := net.Pipe()
		go func() { _, _ = io.Copy(server, server); server.Close() }()
		guestproto.ServeConn(ctx, s, conn)
		return
	}
	if s.Reply(guestproto.Reply{}) != nil {
		return
	}
	n, err := io.Copy(s, s)
	if err == nil {
		_ = s.Exit(guestproto.Reply{Written: n})
	}
}

// FuzzAgentRead: the guest Agent reads whatever a host sends, then the
// host hangs up. Nothing may panic or hang, and the agent must serve the
// next host as if nothing had happened.
func FuzzAgentRead(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, host []byte) {
		tr := guestprototest.New()
		agent := guestproto.NewAgent(tr, echoHandler{}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- agent.Run(ctx) }()
		defer func() {
			cancel()
			_ = tr.Close()
			select {
			case <-ran:
			case <-time.After(fuzzBound):
				t.Fatalf("agent Run did not return within %v of its end", fuzzBound)
			}
		}()

		conn := tr.Connect(true)
		go io.Copy(io.Discard, conn)
		_, _ = conn.Write(host)
		_ = conn.Close()

		c := guestproto.NewClient(tr.Connect(true))
		defer c.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), fuzzBound)
		defer ccancel()
		if _, err := c.Hello(cctx, guestproto.HelloRequest{Session: "after-fuzz"}); err != nil {
			t.Fatalf("Hello after the input: %v", err)
		}
		s, err := c.OpenForTest(cctx, &guestproto.OpenRequest{Op: "echo"})
		if err != nil {
			t.Fatalf("open after the input: %v", err)
		}
		if _, err := c.WaitReplyForTest(s); err != nil {
			t.Fatalf("reply after the input: %v", err)
		}
		if _, err := s.Write([]byte("still here")); err != nil {
			t.Fatalf("write after the input: %v", err)
		}
		_ = s.CloseWrite()
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "still here" {
			t.Fatalf("echo after the input = %q, %v; want %q", got, err, "still here")
		}
	})
}

// FuzzListing: the host's decoder of a listing's DATA.
func FuzzListing(f *testing.F) {
	f.Add([]byte(`{"name":"a","path":"/d/a","size":1,"mode":420}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxEntries, maxBytes = 8, 2048
		list, err := guestproto.DecodeListingForTest(bytes.NewReader(data), "/d", maxEntries, maxBytes)
		switch code := guestproto.CodeOf(err); {
		case err == nil:
			if len(list) > maxEntries {
				t.Fatalf("%d entries, over the limit of %d", len(list), maxEntries)
			}
			if len(data) > maxBytes+1 {
				t.Fatalf("accepted %d bytes of listing, over the limit of %d", len(data), maxBytes)
			}
		case code == guestproto.CodeTooLarge || code == guestproto.CodeInternal:
			if list != nil {
				t.Fatalf("entries returned with the error %v", err)
			}
		default:
			t.Fatalf("listing error %v has neither code too_large nor internal", err)
		}
	})
}

// roundTrip checks that encoding is stable after one decode: what the
// first encoding says, a decode and re-encode says again.
func roundTrip[T any](t *testing.T, v *T) {
	t.Helper()
	b1, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %+v: %v", v, err)
	}
	var w T
	if err := json.Unmarshal(b1, &w); err != nil {
		t.Fatalf("decode our own %s: %v", b1, err)
	}
	b2, err := json.Marshal(&w)
	if err != nil {
		t.Fatalf("encode %+v: %v", w, err)
	}
	if !bytes.Equal(b1, b2) {
		t.Fatalf("re-encoding differs:\n%s\n%s", b1, b2)
	}
}

// FuzzOpenRequest: the agent's decoding of OPEN, with ExecRequest.Validate,
// ValidPath and ValidPort on what it carries.
func FuzzOpenRequest(f *testing.F) {
	f.Add([]byte(`{"op":"exec","exec":{"argv":["ls","-l"],"env":{"K":"V"},"cwd":"/work","timeout_ms":5000,"stdin":true}}`))
	f.Add([]byte(`{"op":"volumes","volumes":[{"tag":"vol_a","path":"/mnt/a"},{"tag":"b","path":"/mnt/a/b","read_only":true}]}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var req guestproto.OpenRequest
		if json.Unmarshal(payload, &req) != nil {
			return
		}
		roundTrip(t, &req)
		checkPath(t, req.Path)
		checkPath(t, req.NewPath)
		if err := guestproto.ValidPort(req.Port); (err == nil) != (req.Port >= 1 && req.Port <= 65535) || err != nil && !errors.Is(err, guestproto.ErrInvalid) {
			t.Fatalf("ValidPort(%d) = %v", req.Port, err)
		}
		if req.Exec != nil {
			checkExec(t, req.Exec)
		}
		checkVolumes(t, req.Volumes)
	})
}

// checkVolumes: mounts ValidateVolumeMounts accepts are few, tagged,
// absolute, clean, distinct and apart; what it refuses is CodeInvalid.
func checkVolumes(t *testing.T, mounts []guestproto.VolumeMount) {
	t.Helper()
	err := guestproto.ValidateVolumeMounts(mounts)
	if err != nil {
		if !errors.Is(err, guestproto.ErrInvalid) {
			t.Fatalf("ValidateVolumeMounts(%+v) = %v, want code invalid", mounts, err)
		}
		return
	}
	if len(mounts) > guestproto.MaxVolumeMounts {
		t.Fatalf("valid: %d mounts", len(mounts))
	}
	for i, m := range mounts {
		if m.Tag == "" || len(m.Tag) > guestproto.MaxVolumeTagLen || m.Path == "/" || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path {
			t.Fatalf("valid mount %+v", m)
		}
		for _, o := range mounts[:i] {
			if o.Tag == m.Tag || o.Path == m.Path || strings.HasPrefix(m.Path+"/", o.Path+"/") || strings.HasPrefix(o.Path+"/", m.Path+"/") {
				t.Fatalf("valid mounts %+v and %+v collide", o, m)
			}
		}
	}
}

func checkPath(t *testing.T, p string) {
	t.Helper()
	err := guestproto.ValidPath(p)
	want := p != "" && path.IsAbs(p) && !strings.ContainsRune(p, 0)
	if (err == nil) != want {
		t.Fatalf("ValidPath(%q) = %v, want valid %v", p, err, want)
	}
	if err != nil && !errors.Is(err, guestproto.ErrInvalid) {
		t.Fatalf("ValidPath(%q) = %v, want code invalid", p, err)
	}
}

func checkExec(t *testing.T, r *guestproto.ExecRequest) {
	t.Helper()
	if r.Validate() != nil {
		return
	}
	if (len(r.Argv) > 0) == (r.Shell != "") {
		t.Fatalf("valid exec %+v: want exactly one of argv and shell", r)
	}
	if len(r.Argv) > 0 && r.Argv[0] == "" {
		t.Fatalf("valid exec %+v with an empty argv[0]", r)
	}
	if r.Cwd != "" && !path.IsAbs(r.Cwd) || r.TimeoutMS < 0 {
		t.Fatalf("valid exec %+v with a relative cwd or a negative timeout", r)
	}
	for _, a := range r.Argv {
		if strings.ContainsRune(a, 0) {
			t.Fatalf("valid exec %+v with a NUL in argv", r)
		}
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			t.Fatalf("valid exec %+v with env entry %q=%q", r, k, v)
		}
	}
}

// FuzzExecRequest: ExecRequest.Validate on any decoded request.
func FuzzExecRequest(f *testing.F) {
	f.Add([]byte(`{"shell":"echo hi","cwd":"/","timeout_ms":1}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r guestproto.ExecRequest
		if json.Unmarshal(payload, &r) != nil {
			return
		}
		roundTrip(t, &r)
		checkExec(t, &r)
	})
}

// FuzzReply: the host's decoding of REPLY and EXIT payloads.
func FuzzReply(f *testing.F) {
	f.Add([]byte(`{"pid":42,"info":{"name":"f","path":"/f","size":5,"mode":2541,"is_symlink":true,"link_target":"/t"}}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r guestproto.Reply
		if json.Unmarshal(payload, &r) != nil {
			return
		}
		roundTrip(t, &r)
		if r.Info != nil {
			m := r.Info.FileMode()
			if r.Info.IsDir && !m.IsDir() {
				t.Fatalf("FileMode %v of a directory", m)
			}
			_ = r.Info.ModTime()
		}
		if r.Error != nil {
			_ = r.Error.Error()
			_ = guestproto.CodeOf(r.Error)
		}
	})
}

// FuzzHello: both ends' decoding of HELLO and HELLO_ACK, and
// HelloRequest.Validate.
func FuzzHello(f *testing.F) {
	f.Add([]byte(`{"session":"s","time_unix_nano":1,"entropy":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","machine_id":"0123456789abcdef0123456789abcdef"}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		var req guestproto.HelloRequest
		if json.Unmarshal(payload, &req) == nil {
			roundTrip(t, &req)
			if req.Validate() == nil {
				if req.Session == "" || len(req.Session) > 128 || len(req.Entropy) < guestproto.MinEntropy || len(req.Entropy) > 4096 {
					t.Fatalf("valid HELLO %+v out of its bounds", req)
				}
				if len(req.Hostname) > 64 || strings.ContainsAny(req.Hostname, "/\x00 \n") {
					t.Fatalf("valid HELLO with hostname %q", req.Hostname)
				}
			}
		}
		var rep guestproto.HelloReply
		if json.Unmarshal(payload, &rep) == nil {
			roundTrip(t, &rep)
		}
	})
}

// FuzzValidPath: ValidPath accepts exactly the absolute paths without NUL.
func FuzzValidPath(f *testing.F) {
	for _, p := range []string{"", "/", "a", "/a/../b", "/a\x00b", "//x", " /x"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) { checkPath(t, p) })
}
