package guestproto_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// TestProcessesNeedFeature: an agent that does not list FeatureProcesses
// is refused at once, with nothing sent to it.
func TestProcessesNeedFeature(t *testing.T) {
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	ctx := context.Background()
	for name, run := range map[string]func() error{
		"start":  func() error { _, err := c.StartProcess(ctx, guestproto.ExecRequest{Argv: []string{"x"}}); return err },
		"list":   func() error { _, err := c.ListProcesses(ctx); return err },
		"attach": func() error { _, err := c.AttachProcess(ctx, 1, 0, 0); return err },
		"stdin":  func() error { return c.WriteProcessStdin(ctx, 1, []byte("x")) },
		"signal": func() error { return c.SignalProcess(ctx, 1, "TERM") },
		"wait":   func() error { _, err := c.WaitProcess(ctx, 1); return err },
		"remove": func() error { return c.RemoveProcess(ctx, 1) },
	} {
		err := within(t, testTimeout, name, run)
		if !errors.Is(err, guestproto.ErrInvalid) || !strings.Contains(err.Error(), "too old") {
			t.Errorf("%s on an old agent = %v, want ErrInvalid saying it is too old", name, err)
		}
	}
	select {
	case f := <-p.frames:
		t.Errorf("the old agent got a frame %v", f.Type)
	default:
	}
}

// TestHostileProcessReplies: a guest's malformed or missing answers to the
// proc_* operations are errors, never hangs.
func TestHostileProcessReplies(t *testing.T) {
	const callTimeout = 200 * time.Millisecond
	c, p := newPeerFeatures(t, guestproto.ClientConfig{CallTimeout: callTimeout}, nil, guestproto.FeatureProcesses)

	t.Run("start without proc", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			_, err := c.StartProcess(context.Background(), guestproto.ExecRequest{Argv: []string{"x"}})
			done <- err
		}()
		open := p.waitFor(guestproto.FrameOpen, 0)
		p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
		if err := await(t, done, testTimeout, "StartProcess"); !errors.Is(err, guestproto.ErrInternal) {
			t.Errorf("got %v, want ErrInternal", err)
		}
	})
	t.Run("attach without start", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { _, err := c.AttachProcess(context.Background(), 7, 0, 0); done <- err }()
		open := p.waitFor(guestproto.FrameOpen, 0)
		p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{})
		if err := await(t, done, testTimeout, "AttachProcess"); !errors.Is(err, guestproto.ErrInternal) {
			t.Errorf("got %v, want ErrInternal", err)
		}
	})
	t.Run("attach ends without exit", func(t *testing.T) {
		done := make(chan error, 1)
		go func() {
			a, err := c.AttachProcess(context.Background(), 7, 0, 0)
			if err == nil {
				io.Copy(io.Discard, a.Stdout)
				io.Copy(io.Discard, a.Stderr)
				_, _, err = a.End()
			}
			done <- err
		}()
		open := p.waitFor(guestproto.FrameOpen, 0)
		p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{Proc: &guestproto.ProcInfo{PID: 7}, Attach: &guestproto.AttachStart{}})
		p.sendJSON(guestproto.FrameExit, open.Stream, guestproto.Reply{Proc: &guestproto.ProcInfo{PID: 7}})
		p.send(guestproto.Frame{Type: guestproto.FrameClose, Stream: open.Stream})
		if err := await(t, done, testTimeout, "attach End"); !errors.Is(err, guestproto.ErrInternal) {
			t.Errorf("got %v, want ErrInternal", err)
		}
	})
	t.Run("never replies", func(t *testing.T) {
		err := within(t, testTimeout, "signal", func() error { return c.SignalProcess(context.Background(), 7, "TERM") })
		if !errors.Is(err, guestproto.ErrTimeout) {
			t.Errorf("got %v, want a timeout", err)
		}
		p.waitFor(guestproto.FrameOpen, 0)
	})
	t.Run("wait is cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := c.WaitProcess(ctx, 7); done <- err }()
		open := p.waitFor(guestproto.FrameOpen, 0)
		p.sendJSON(guestproto.FrameReply, open.Stream, guestproto.Reply{Proc: &guestproto.ProcInfo{PID: 7}})
		cancel()
		if err := await(t, done, testTimeout, "WaitProcess"); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for name, err := range map[string]error{
			"pid 0":      c.SignalProcess(context.Background(), 0, "TERM"),
			"offset -2":  func() error { _, err := c.AttachProcess(context.Background(), 1, -2, 0); return err }(),
			"empty argv": func() error { _, err := c.StartProcess(context.Background(), guestproto.ExecRequest{}); return err }(),
		} {
			if !errors.Is(err, guestproto.ErrInvalid) {
				t.Errorf("%s: got %v, want ErrInvalid", name, err)
			}
		}
	})
}
