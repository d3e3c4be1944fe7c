package guest_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/guest"
)

// TestPortWaitHost exercises the port's O_ASYNC wait on a FIFO, which like a
// virtio port raises SIGIO for its owner when bytes arrive.
func TestPortWaitHost(t *testing.T) {
	path := filepath.Join(t.TempDir(), "port")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := guest.OpenPort(path)
	if err != nil {
		t.Fatalf("OpenPort: %v", err)
	}
	host, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if _, err := host.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitHost(testContext(t)); err != nil {
		t.Fatalf("WaitHost: %v", err)
	}
	buf := make([]byte, 2)
	if n, err := p.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("Read = %q, %v; want hi", buf[:n], err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.WaitHost(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitHost with a canceled ctx = %v, want context.Canceled", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.WaitHost(context.Background()); !errors.Is(err, os.ErrClosed) {
		t.Errorf("WaitHost after Close = %v, want os.ErrClosed", err)
	}
}
