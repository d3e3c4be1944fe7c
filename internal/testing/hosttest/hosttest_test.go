package hosttest

import (
	"context"
	"errors"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
)

// The fake keeps the contract's states and error classes.
func TestStates(t *testing.T) {
	ctx := t.Context()
	h := New()
	if _, err := h.Create(ctx, host.CreateRequest{ID: "a", Template: "base", MemoryMiB: 512, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Create(ctx, host.CreateRequest{ID: "a"}); !errors.Is(err, host.ErrConflict) {
		t.Errorf("create of a taken id: %v, want ErrConflict", err)
	}
	if _, err := h.Resume(ctx, "a"); !errors.Is(err, host.ErrConflict) {
		t.Errorf("resume of a running sandbox: %v, want ErrConflict", err)
	}
	if _, err := h.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if info, _ := h.Sandbox("a"); info.State != lifecycle.Paused {
		t.Errorf("after pause: %s, want paused", info.State)
	}
	if _, err := h.Fork(ctx, "a", []string{"b"}); !errors.Is(err, host.ErrConflict) {
		t.Errorf("fork of a paused sandbox: %v, want ErrConflict", err)
	}
	if err := h.Kill(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := h.Kill(ctx, "a"); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("second kill: %v, want ErrNotFound", err)
	}
}

// A fault applies to the next matching call only, and has no effect.
func TestFail(t *testing.T) {
	ctx := t.Context()
	h := New()
	boom := errors.New("boom")
	h.Fail(Create, "b", boom)
	if _, err := h.Create(ctx, host.CreateRequest{ID: "a"}); err != nil {
		t.Fatalf("create of another id: %v", err)
	}
	if _, err := h.Create(ctx, host.CreateRequest{ID: "b"}); !errors.Is(err, boom) {
		t.Fatalf("create b: %v, want boom", err)
	}
	if _, ok := h.Sandbox("b"); ok {
		t.Error("a failed create left a sandbox")
	}
	if _, err := h.Create(ctx, host.CreateRequest{ID: "b"}); err != nil {
		t.Errorf("second create b: %v, want success", err)
	}
	if got, want := h.CallsOf(Create, "b"), 2; got != want {
		t.Errorf("CallsOf(Create, b) = %d, want %d", got, want)
	}
}

// A held call waits for its release, or returns its ctx's error without
// effect.
func TestBlock(t *testing.T) {
	h := New()
	g := h.Block(Create, "")
	done := make(chan error)
	go func() {
		_, err := h.Create(t.Context(), host.CreateRequest{ID: "a"})
		done <- err
	}()
	<-g.Reached()
	if g.ID() != "a" {
		t.Errorf("gate ID = %q, want a", g.ID())
	}
	if _, ok := h.Sandbox("a"); ok {
		t.Error("a held create has taken effect")
	}
	g.Release(nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Sandbox("a"); !ok {
		t.Error("a released create has no sandbox")
	}

	ctx, cancel := context.WithCancel(t.Context())
	g = h.Block(Pause, "a")
	go func() {
		_, err := h.Pause(ctx, "a")
		done <- err
	}()
	<-g.Reached()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("held pause whose ctx ended: %v, want context.Canceled", err)
	}
	if info, _ := h.Sandbox("a"); info.State != lifecycle.Running {
		t.Errorf("after a canceled pause: %s, want running", info.State)
	}
}

func TestForkChildFails(t *testing.T) {
	ctx := t.Context()
	h := New()
	if _, err := h.Create(ctx, host.CreateRequest{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	h.FailForkChild(1, boom)
	res, err := h.Fork(ctx, "p", []string{"c0", "c1", "c2"})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range res.Children {
		if wantErr := i == 1; (c.Err != nil) != wantErr {
			t.Errorf("child %d: err %v, want failure %v", i, c.Err, wantErr)
		}
		if _, ok := h.Sandbox(c.Info.ID); ok == (i == 1) {
			t.Errorf("child %d: on the host %v", i, ok)
		}
	}
	// Only the next fork.
	res, _ = h.Fork(ctx, "p", []string{"d0", "d1"})
	if res.Children[1].Err != nil {
		t.Errorf("second fork's child 1 failed: %v", res.Children[1].Err)
	}
}

func TestExit(t *testing.T) {
	h := New()
	var got []string
	h.OnExit = func(id string, cause error) { got = append(got, id) }
	h.Put(host.Info{ID: "a", State: lifecycle.Running})
	h.Exit("a", nil)
	if _, ok := h.Sandbox("a"); ok || len(got) != 1 || got[0] != "a" {
		t.Errorf("after Exit: on host %v, OnExit told %v", ok, got)
	}
}
