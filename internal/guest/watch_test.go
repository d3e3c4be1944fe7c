package guest_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// nextEvent is the next event of w other than a probe of ready.
func nextEvent(t *testing.T, w *guestproto.DirWatch) guestproto.WatchEvent {
	t.Helper()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		return ev
	}
}

// TestWatchDir watches a temporary directory with real inotify: create,
// write, rename, chmod and remove of a file, a file in a subdirectory
// (recursive), and the end of the watch when the directory goes.
func TestWatchDir(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "old"), 0o755); err != nil {
		t.Fatal(err)
	}
	w, err := c.WatchDir(testContext(t), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	f := filepath.Join(dir, "f")
	g := filepath.Join(dir, "g")
	sub := filepath.Join(dir, "sub")
	steps := []struct {
		do   func() error
		want []guestproto.WatchEvent
	}{
		{func() error { return os.WriteFile(f, nil, 0o644) }, []guestproto.WatchEvent{{Type: "create", Path: f}}},
		// One write, no truncation: os.WriteFile's O_TRUNC is a
		// modification of its own, a second write event when the guest
		// reads the first before the kernel can merge them.
		{func() error { return appendFile(f, "hello") }, []guestproto.WatchEvent{{Type: "write", Path: f}}},
		{func() error { return os.Rename(f, g) }, []guestproto.WatchEvent{{Type: "rename", Path: g, OldPath: f}}},
		{func() error { return os.Chmod(g, 0o600) }, []guestproto.WatchEvent{{Type: "chmod", Path: g}}},
		{func() error { return os.Remove(g) }, []guestproto.WatchEvent{{Type: "remove", Path: g}}},
		{func() error { return os.Mkdir(sub, 0o755) }, []guestproto.WatchEvent{{Type: "create", Path: sub, IsDir: true}}},
		{func() error { return os.WriteFile(filepath.Join(sub, "x"), nil, 0o644) }, []guestproto.WatchEvent{{Type: "create", Path: filepath.Join(sub, "x")}}},
		{func() error { return os.WriteFile(filepath.Join(dir, "old", "y"), nil, 0o644) }, []guestproto.WatchEvent{{Type: "create", Path: filepath.Join(dir, "old", "y")}}},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatal(err)
		}
		for _, want := range s.want {
			if got := nextEvent(t, w); got != want {
				t.Fatalf("step %d: got %+v, want %+v", i, got, want)
			}
		}
	}
	// Removing the watched directory ends the watch.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("after removing the directory: %v", err)
		}
		_ = ev // the removes of its entries, then of itself
	}
	t.Fatal("the watch did not end when its directory was removed")
}

func appendFile(path, data string) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := fh.WriteString(data); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

func TestWatchDirErrors(t *testing.T) {
	c := newClient(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path string
		want guestproto.Code
	}{
		{"/no/such/dir", guestproto.CodeNotFound},
		{file, guestproto.CodeNotDir},
		{"relative", guestproto.CodeInvalid},
	} {
		_, err := c.WatchDir(testContext(t), tt.path, false)
		var pe *guestproto.Error
		if !errors.As(err, &pe) || pe.Code != tt.want {
			t.Errorf("WatchDir(%s): got %v, want code %s", tt.path, err, tt.want)
		}
	}
}

// TestWatchDirClose: closing a watch ends it in the guest (the next watch
// on the same client works).
func TestWatchDirClose(t *testing.T) {
	c := newClient(t)
	dir := t.TempDir()
	for range 3 {
		w, err := c.WatchDir(testContext(t), dir, false)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if _, err := w.Next(); err == nil {
			t.Fatal("Next after Close: got an event, want an error")
		}
	}
}
