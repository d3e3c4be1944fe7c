package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
)

func TestLineageBase(t *testing.T) {
	info := func(id, lineage string) capture.Info {
		return capture.Info{SnapshotInfo: host.SnapshotInfo{ID: id, Lineage: lineage}}
	}
	for _, tc := range []struct {
		name string
		si   capture.Info
		held []string
		want string
	}{
		{"held", info("c", "s"), []string{"x", "s"}, "s"},
		{"not held", info("c", "s"), []string{"x"}, ""},
		{"no lineage", info("c", ""), []string{""}, ""},
		{"itself", info("s", "s"), []string{"s"}, ""},
	} {
		if got := LineageBase(tc.si, tc.held); got != tc.want {
			t.Errorf("%s: LineageBase = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestArrival: a machine starting from a snapshot that arrives sees its
// description once begun, its disk once in, the receive's end and the
// directory its files are in, which moves once only.
func TestArrival(t *testing.T) {
	ctx := context.Background()
	ar := NewArrival()
	si := capture.Info{SnapshotInfo: host.SnapshotInfo{ID: "s1"}}
	ar.begin(si, "/tmp/s1.fetch")
	<-ar.Begun()
	if got := ar.Info().ID; got != "s1" {
		t.Errorf("Info().ID = %q, want s1", got)
	}
	ar.diskIn()
	ar.diskIn() // twice: once is what counts
	if err := ar.WaitDisk(ctx); err != nil {
		t.Errorf("WaitDisk = %v, want nil", err)
	}
	var dir string
	ar.WithDir(func(d string) error { dir = d; return nil })
	if dir != "/tmp/s1.fetch" {
		t.Errorf("dir while arriving = %q, want /tmp/s1.fetch", dir)
	}
	if err := ar.move("/tmp/s1", func() error { return errors.New("rename failed") }); err == nil {
		t.Error("move returned nil for a failed move")
	}
	ar.WithDir(func(d string) error { dir = d; return nil })
	if dir != "/tmp/s1.fetch" {
		t.Errorf("dir after a failed move = %q, want /tmp/s1.fetch", dir)
	}
	if err := ar.move("/tmp/s1", func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	ar.WithDir(func(d string) error { dir = d; return nil })
	if dir != "/tmp/s1" {
		t.Errorf("dir after the move = %q, want /tmp/s1", dir)
	}
	cut := errors.New("cut short")
	ar.end(cut)
	if err := ar.Wait(ctx); !errors.Is(err, cut) {
		t.Errorf("Wait = %v, want %v", err, cut)
	}
}

// TestArrivalEndsBeforeDisk: a receive that fails before the disk is in
// ends WaitDisk with its error; a cancelled wait ends with ctx's.
func TestArrivalEndsBeforeDisk(t *testing.T) {
	ar := NewArrival()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ar.WaitDisk(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitDisk with a cancelled ctx = %v, want context.Canceled", err)
	}
	bad := errors.New("refused")
	ar.end(bad)
	if err := ar.WaitDisk(context.Background()); !errors.Is(err, bad) {
		t.Errorf("WaitDisk after the receive ended = %v, want %v", err, bad)
	}
	var nilArrival *Arrival
	ran := false
	if err := nilArrival.WithDir(func(string) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("a nil arrival's WithDir: ran %v, err %v; want it run", ran, err)
	}
}
