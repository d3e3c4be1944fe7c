package main

// TestHostileGuest: a real `panda up` whose guests run a hostile agent
// (internal/testing/hostileguest: the real guest agent,
// which bakes and serves normally until an exec of ["hostile", MODE] turns
// it against the host). Each mode is triggered through the REST API, and
// the test checks that nothing a guest does costs the server unbounded
// memory or time:
//
//   - the server's RSS stays under rssBound the whole time (a guest that
//     grants a GiB of upload credit and stops reading used to make the
//     server queue the GiB);
//   - every request that waits on a hostile guest ends, with an error,
//     within a bound derived from guestproto's defaults (WriteTimeout 10 s,
//     CallTimeout 60 s, ExecGrace 10 s);
//   - DELETE of a sandbox works within killBound, also while a snapshot of
//     it waits for a BARRIER the guest never answers;
//   - a healthy sandbox on the same server keeps serving throughout.
//
// The hostile agent is put into a copy of the guest images: a second newc
// archive holding /panda-guest is appended to the initramfs (the kernel
// unpacks concatenated archives, later entries win), the kernel and the
// tiny root filesystem are symlinked.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

const (
	// rssBound is the most resident memory `panda up` may use during the
	// test. It peaks at about 80 MiB here: what a guest can make the host
	// hold is its credit per stream (256 KiB a channel), a listing (8 MiB),
	// one frame per connection for outgoing data, and a buffered exec's
	// output (the API's 16 MiB caps), plus the garbage collector's slack.
	// A host that queued what a guest's credit allows would hold the GiB
	// that grant-and-stop grants.
	rssBound = 192 << 20
	// killBound is how long a DELETE may take, whatever the guest does.
	killBound = 10 * time.Second
	// promptBound is how long a request may take that fails on what the
	// guest sends (a flood, a malformed frame, a listing over the limits).
	promptBound = 30 * time.Second
)

func TestHostileGuest(t *testing.T) {
	e2e(t)
	images := hostileImages(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	srv := start(t, "hostile", pandatest.Options{DataDir: dir, Images: images, Args: tinyDefaults})
	rss := watchRSS(t, srv.PID())
	c := srv.client(t)

	healthy := mustCreate(t, ctx, c) // bakes the template: the hostile agent serves normally
	if got := mustExec(t, ctx, healthy, "echo ok"); got != "ok\n" {
		t.Fatalf("exec in a sandbox of the hostile template: got %q, want ok", got)
	}
	stillServes := func(when string) {
		t.Helper()
		ectx, cancel := context.WithTimeout(ctx, promptBound)
		defer cancel()
		r, err := healthy.Exec(ectx, pandastack.Command{Cmd: "echo fine"})
		if err != nil || r.Stdout != "fine\n" {
			t.Errorf("healthy sandbox %s: exec = %q, %v; want fine", when, r.Stdout, err)
		}
	}

	t.Run("flood", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		err := timed(t, promptBound, "exec of a guest that floods stdout past its credit", func() error {
			_, err := sb.Exec(ctx, hostileCmd("flood"))
			return err
		})
		wantAPIError(t, err, 502, "guest agent failed")
		if got := mustExec(t, ctx, sb, "echo after"); got != "after\n" {
			t.Errorf("exec after the flood: got %q, want after", got)
		}
	})

	t.Run("listings", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"huge-list"}, "has more than 10000 entries; list a subdirectory"},
			{[]string{"huge-list", "4000"}, "exceeds 8388608 bytes; list a subdirectory"},
			{[]string{"endless-list"}, "exceeds 65536 bytes"},
		} {
			if _, err := sb.Exec(ctx, hostileCmd(tt.args...)); err != nil {
				t.Fatalf("arm %v: %v", tt.args, err)
			}
			err := timed(t, promptBound, fmt.Sprintf("listing of a guest that answers %v", tt.args), func() error {
				_, err := sb.ListFiles(ctx, "/tmp")
				return err
			})
			wantAPIError(t, err, 422, tt.want)
		}
		if got := mustExec(t, ctx, sb, "echo after"); got != "after\n" {
			t.Errorf("exec after the listings: got %q, want after", got)
		}
	})

	t.Run("bad reply", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		err := timed(t, promptBound, "exec answered with unterminated JSON", func() error {
			_, err := sb.Exec(ctx, hostileCmd("bad-reply"))
			return err
		})
		wantAPIError(t, err, 502, "guest agent failed")
		mustExec(t, ctx, sb, "true")
	})

	t.Run("exec that never ends", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		cmd := hostileCmd("hang")
		cmd.Timeout = time.Second
		start := time.Now()
		err := timed(t, cmd.Timeout+guestproto.DefaultExecGrace+promptBound, "exec that ignores its timeout", func() error {
			_, err := sb.Exec(ctx, cmd)
			return err
		})
		wantAPIError(t, err, 504, "did not end the exec within its timeout")
		if d := time.Since(start); d < cmd.Timeout+guestproto.DefaultExecGrace {
			t.Errorf("gave up after %v, before the timeout and its grace", d)
		}
	})

	t.Run("too many operations", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		cmd := hostileCmd("hang")
		cmd.Timeout = time.Minute
		started := make(chan error, rest.DefaultMaxGuestRequestsPerSandbox)
		ended := make(chan error, rest.DefaultMaxGuestRequestsPerSandbox)
		for range rest.DefaultMaxGuestRequestsPerSandbox {
			go func() {
				hanging := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					_, err := sb.ExecStream(sctx, cmd, &lineSignal{lines: map[string]chan struct{}{"hanging": hanging}}, nil)
					done <- err
				}()
				select {
				case <-hanging:
					started <- nil
					ended <- <-done
				case err := <-done:
					started <- fmt.Errorf("exec ended before it hung: %w", err)
					ended <- err
				}
			}()
		}
		for range rest.DefaultMaxGuestRequestsPerSandbox {
			select {
			case err := <-started:
				if err != nil {
					t.Fatalf("one of %d concurrent execs: %v", rest.DefaultMaxGuestRequestsPerSandbox, err)
				}
			case <-time.After(2 * promptBound):
				t.Fatalf("%d concurrent execs not all running within %v", rest.DefaultMaxGuestRequestsPerSandbox, 2*promptBound)
			}
		}
		err := timed(t, promptBound, fmt.Sprintf("a request beyond %d operations in flight", rest.DefaultMaxGuestRequestsPerSandbox), func() error {
			_, err := sb.Stat(ctx, "/")
			return err
		})
		wantAPIError(t, err, 429, "requests in flight")
		timed(t, killBound, "DELETE with every stream taken", func() error { return mustKill(t, ctx, sb) })
		for range rest.DefaultMaxGuestRequestsPerSandbox {
			select {
			case <-ended:
			case <-time.After(promptBound):
				t.Fatalf("an exec of a deleted sandbox did not end within %v", promptBound)
			}
		}
	})

	t.Run("garbage", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		err := timed(t, promptBound, "exec answered with a malformed frame", func() error {
			_, err := sb.Exec(ctx, hostileCmd("garbage"))
			return err
		})
		wantAPIError(t, err, 503, "stopped answering")
		// The connection is gone; the host reconnects and greets the guest
		// again. A request meanwhile answers at once: 503 until the guest
		// answers, then normally (this guest behaves in a new session).
		err = timed(t, promptBound, "exec after a malformed frame", func() error {
			_, err := sb.Exec(ctx, pandastack.Command{Cmd: "true"})
			return err
		})
		var ae *pandastack.Error
		if err != nil && (!errors.As(err, &ae) || ae.Status != 503) {
			t.Errorf("exec after a malformed frame: %v, want success or 503", err)
		}
		timed(t, killBound, "DELETE after a malformed frame", func() error { return mustKill(t, ctx, sb) })
	})

	t.Run("grants credit and stops reading", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		if _, err := sb.Exec(ctx, hostileCmd("grant-and-stop")); err != nil {
			t.Fatalf("arm grant-and-stop: %v", err)
		}
		src := &countingReader{r: guestprototest.PatternReader(7, 1<<30)}
		err := timed(t, guestproto.DefaultWriteTimeout+promptBound, "upload to a guest that stopped reading", func() error {
			_, err := sb.WriteFile(ctx, "/root/big", src, 0o644)
			return err
		})
		if err == nil {
			t.Errorf("upload of 1 GiB to a guest that stopped reading succeeded")
		}
		// The server pulls from the request body only as fast as the guest
		// takes bytes: the socket buffers between here and the guest (TCP
		// both ways, the unix socket, the virtio ring), not the GiB of credit.
		if got := src.n.Load(); got > 64<<20 {
			t.Errorf("the server read %d MiB of the upload from a guest that took none", got>>20)
		}
		stillServes("after a stalled upload")
		timed(t, killBound, "DELETE of a guest that stopped reading", func() error { return mustKill(t, ctx, sb) })
	})

	t.Run("barrier never answered", func(t *testing.T) {
		sb := mustCreate(t, ctx, c)
		armed, dropped := make(chan struct{}), make(chan struct{})
		streamDone := make(chan error, 1)
		go func() {
			out := &lineSignal{lines: map[string]chan struct{}{"no-barrier armed": armed, "barrier dropped": dropped}}
			_, err := sb.ExecStream(ctx, hostileCmd("no-barrier"), out, nil)
			streamDone <- err
		}()
		select {
		case <-armed:
		case err := <-streamDone:
			t.Fatalf("exec no-barrier ended before it armed: %v", err)
		case <-time.After(promptBound):
			t.Fatalf("exec no-barrier not armed within %v", promptBound)
		}
		snapDone := make(chan error, 1)
		snapStart := time.Now()
		go func() {
			_, err := sb.Snapshot(ctx, "")
			snapDone <- err
		}()
		select {
		case <-dropped: // the capture waits on the barrier now
		case err := <-snapDone:
			t.Fatalf("snapshot ended (%v) before the guest dropped its BARRIER", err)
		case <-time.After(promptBound):
			t.Fatalf("the guest did not report a dropped BARRIER within %v", promptBound)
		}
		stillServes("while another sandbox's snapshot waits on a barrier")
		killStart := time.Now()
		err := timed(t, guestproto.DefaultCallTimeout+promptBound, "DELETE while a snapshot waits on a barrier", func() error {
			return mustKill(t, ctx, sb)
		})
		if d := time.Since(killStart); err == nil && d > killBound {
			t.Errorf("DELETE took %v while a snapshot waited on the guest's barrier, want at most %v "+
				"(the snapshot ended %s)", d.Round(time.Millisecond), killBound, snapshotEnd(snapDone, snapStart))
		}
		select {
		case err := <-snapDone:
			if err == nil {
				t.Errorf("snapshot of a guest that never answered BARRIER succeeded")
			}
		case <-time.After(guestproto.DefaultCallTimeout + promptBound):
			t.Errorf("snapshot still waiting %v after it started", time.Since(snapStart))
		}
		select {
		case <-streamDone:
		case <-time.After(promptBound):
			t.Errorf("the exec stream of a deleted sandbox did not end")
		}
	})

	stillServes("at the end")
	if max := rss.Max(); max > rssBound {
		t.Errorf("server RSS reached %d MiB, want at most %d MiB", max>>20, rssBound>>20)
	} else {
		t.Logf("server RSS peaked at %d MiB (bound %d MiB)", max>>20, rssBound>>20)
	}
}

func hostileCmd(args ...string) pandastack.Command {
	return pandastack.Command{Argv: append([]string{"hostile"}, args...)}
}

// timed runs fn, which must return within d; it returns fn's error.
func timed(t *testing.T, d time.Duration, what string, fn func() error) error {
	t.Helper()
	ch := make(chan error, 1)
	start := time.Now()
	go func() { ch <- fn() }()
	select {
	case err := <-ch:
		t.Logf("%s: %v after %v", what, err, time.Since(start).Round(time.Millisecond))
		return err
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return nil
	}
}

// wantAPIError checks err is an API error with status (and a message
// containing msg, if not empty).
func wantAPIError(t *testing.T, err error, status int, msg string) {
	t.Helper()
	var ae *pandastack.Error
	if !errors.As(err, &ae) {
		t.Errorf("got %v, want an API error with status %d", err, status)
		return
	}
	if ae.Status != status || !strings.Contains(ae.Message, msg) {
		t.Errorf("got status %d, code %s, message %q; want status %d with a message containing %q", ae.Status, ae.Code, ae.Message, status, msg)
	}
}

func mustKill(t *testing.T, ctx context.Context, sb *pandastack.Sandbox) error {
	t.Helper()
	err := sb.Kill(ctx)
	if err != nil {
		t.Errorf("DELETE %s: %v", sb.ID, err)
	}
	return err
}

func snapshotEnd(done chan error, start time.Time) string {
	select {
	case err := <-done:
		done <- err
		return fmt.Sprintf("%v after it started, with %v", time.Since(start).Round(time.Second), err)
	default:
		return "not yet"
	}
}

// lineSignal closes the channel of each line written to it (once).
type lineSignal struct {
	lines map[string]chan struct{}
	buf   []byte
}

func (w *lineSignal) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		line, rest, ok := bytes.Cut(w.buf, []byte("\n"))
		if !ok {
			return len(p), nil
		}
		if ch, ok := w.lines[string(line)]; ok {
			close(ch)
			delete(w.lines, string(line))
		}
		w.buf = rest
	}
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// rssWatch samples a process's VmRSS until the test ends.
type rssWatch struct{ max atomic.Int64 }

func (w *rssWatch) Max() int64 { return w.max.Load() }

func watchRSS(t *testing.T, pid int) *rssWatch {
	w := &rssWatch{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if n, err := vmRSS(pid); err == nil && n > w.max.Load() {
				w.max.Store(n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return w
}

// vmRSS reads VmRSS from /proc/PID/status, in bytes.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// hostileImages builds a guest images directory whose agent is the
// hostile one: the kernel and the tiny root filesystem of the test images,
// symlinked, and a copy of their initramfs with the hostile agent appended
// as /panda-guest. It is removed when the test ends.
func hostileImages(t *testing.T) string {
	t.Helper()
	src := testkit.Images()
	dir, err := os.MkdirTemp("", "hostile-images")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// QEMU runs as an unprivileged user: it must reach the files.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kernel", "rootfs-tiny.ext4"} {
		if err := os.Symlink(filepath.Join(src, name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	agent := filepath.Join(dir, "panda-guest")
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = "/usr/local/go/bin/go"
	}
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", agent,
		"github.com/pandastack/pandastack/internal/testing/hostileguest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the hostile guest agent: %v\n%s", err, out)
	}
	initrd, err := os.ReadFile(filepath.Join(src, "initramfs.img"))
	if err != nil {
		t.Fatalf("read the initramfs: %v", err)
	}
	bin, err := os.ReadFile(agent)
	if err != nil {
		t.Fatal(err)
	}
	// The appended archive must start 4-byte aligned; cpio -o pads to 512.
	for len(initrd)%512 != 0 {
		initrd = append(initrd, 0)
	}
	initrd = appendNewc(initrd, "panda-guest", 0o100755, bin)
	if err := os.WriteFile(filepath.Join(dir, "initramfs.img"), initrd, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// appendNewc appends a newc cpio archive of one file to b.
func appendNewc(b []byte, name string, mode uint32, data []byte) []byte {
	entry := func(b []byte, ino, mode, nlink uint32, name string, data []byte) []byte {
		b = fmt.Appendf(b, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
			ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	b = entry(b, 0x7a7a7a, mode, 1, name, data)
	b = entry(b, 0, 0, 1, "TRAILER!!!", nil)
	for len(b)%512 != 0 {
		b = append(b, 0)
	}
	return b
}
