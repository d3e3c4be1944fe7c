package hostagent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent/volumes"
)

// guestTestSpace is a volumes.Space with a fixed limit.
type guestTestSpace struct {
	mu          sync.Mutex
	used, limit int64
}

func (s *guestTestSpace) Reserve(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used+n > s.limit {
		return syscall.ENOSPC
	}
	s.used += n
	return nil
}

func (s *guestTestSpace) Release(n int64) { s.mu.Lock(); s.used -= n; s.mu.Unlock() }
func (s *guestTestSpace) Used() int64     { s.mu.Lock(); defer s.mu.Unlock(); return s.used }
func (s *guestTestSpace) Limit() int64    { return s.limit }

// TestVolumeGuestMount: a real guest mounts a volume (its kernel's FUSE,
// the agent's file system) served by volumes.Serve from a host directory
// over the guest channel; a second volume stream replaces the first.
func TestVolumeGuestMount(t *testing.T) {
	a := shared(t)
	info := create(t)
	c, err := a.Guest(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	space := &guestTestSpace{limit: 64 << 20}
	mounts := []guestproto.VolumeMount{{Tag: "v", Path: "/mnt/vol"}, {Tag: "r", Path: "/mnt/ro", ReadOnly: true}}
	hm := []volumes.Mount{{Tag: "v", Root: root, Space: space}, {Tag: "r", Root: root, Space: space, ReadOnly: true}}
	serve := func() {
		conn, err := c.OpenVolumes(ctxT(t), mounts)
		if err != nil {
			t.Fatalf("OpenVolumes: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- volumes.Serve(ctx, conn, hm) }()
		t.Cleanup(func() { cancel(); conn.Close(); <-done })
	}
	serve()
	out := sh(t, info.ID, "test -c /dev/fuse && echo fuse; echo hello > /mnt/vol/f && cat /mnt/ro/f; "+
		"mkdir /mnt/vol/d && mv /mnt/vol/f /mnt/vol/d/g && ls /mnt/vol/d; "+
		"df -k /mnt/vol | tail -1 | awk '{print $2}'; "+
		"echo x > /mnt/ro/y 2>/dev/null || echo refused-ro; mkfifo /mnt/vol/p 2>/dev/null || echo refused-fifo; "+
		"ln /mnt/vol/d/g /mnt/vol/h 2>/dev/null || echo refused-link")
	want := "fuse\nhello\ng\n65536\nrefused-ro\nrefused-fifo\nrefused-link\n"
	if out != want {
		t.Errorf("guest: got %q, want %q", out, want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "d/g")); err != nil || string(b) != "hello\n" {
		t.Errorf("host file: %q, %v", b, err)
	}
	// A new stream (as after a host agent restart) replaces the first.
	serve()
	os.WriteFile(filepath.Join(dir, "from-host"), []byte("host\n"), 0o644)
	if out := sh(t, info.ID, "cat /mnt/vol/from-host"); out != "host\n" {
		t.Errorf("read after the stream was replaced: %q", out)
	}
	if out := sh(t, info.ID, "grep -c pandavol /proc/mounts"); strings.TrimSpace(out) != "2" {
		t.Errorf("volume mounts in the guest: %q, want 2", out)
	}
}
