package storesync

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
)

func newRecordsSync(t *testing.T) *Sync {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, StoredDir, PausedRecordDir), 0o700); err != nil {
		t.Fatal(err)
	}
	s := New(Config{Dir: dir})
	t.Cleanup(s.Stop)
	return s
}

// TestForgetLeavesATombstone: a snapshot forgotten has a record that
// says it was deleted and keeps its description.
func TestForgetLeavesATombstone(t *testing.T) {
	s := newRecordsSync(t)
	if _, ok := s.Record("s1"); ok {
		t.Fatal("a record before anything was written")
	}
	si := capture.Info{SnapshotInfo: host.SnapshotInfo{ID: "s1", Template: "base"}}
	if err := s.Forget("s1", si); err != nil {
		t.Fatal(err)
	}
	r, ok := s.Record("s1")
	if !ok || !r.Deleted || r.Durable || r.Snapshot.Template != "base" {
		t.Errorf("record after Forget = %+v (found %v), want deleted, not durable, template base", r, ok)
	}
	if !s.Deleted("s1") || s.Deleted("s2") {
		t.Errorf("Deleted(s1) = %v, Deleted(s2) = %v; want true, false", s.Deleted("s1"), s.Deleted("s2"))
	}
}

// TestPausedTombstones: a capture's tombstone is found by its pause ID
// and by its sandbox alone; another capture of the sandbox is not
// tombstoned by it.
func TestPausedTombstones(t *testing.T) {
	s := newRecordsSync(t)
	if err := s.WritePausedRecord(PausedRecord{SandboxID: "sb", PauseID: "p1", Durable: true}); err != nil {
		t.Fatal(err)
	}
	if s.Tombstoned("sb", "") || s.Tombstoned("sb", "p1") {
		t.Fatal("a durable capture reads as tombstoned")
	}
	if err := s.TombstonePaused("sb", "p2"); err != nil {
		t.Fatal(err)
	}
	if !s.Tombstoned("sb", "p2") || !s.Tombstoned("sb", "") || s.Tombstoned("sb", "p1") || s.Tombstoned("other", "") {
		t.Errorf("tombstones: p2 %v, any %v, p1 %v, other %v; want true, true, false, false",
			s.Tombstoned("sb", "p2"), s.Tombstoned("sb", ""), s.Tombstoned("sb", "p1"), s.Tombstoned("other", ""))
	}
	if err := s.TombstonePaused("sb", "p1"); err != nil {
		t.Fatal(err)
	}
	if r, ok := s.PausedRecord("sb", "p1"); !ok || !r.Deleted || !r.Durable {
		t.Errorf("record of p1 after its tombstone = %+v (found %v), want durable and deleted", r, ok)
	}
}

func TestParsePausedRecordName(t *testing.T) {
	for _, tc := range []struct {
		name, id, pid string
		ok            bool
	}{
		{"sb.p1.json", "sb", "p1", true},
		{"sb.p1", "", "", false},
		{"sb.json", "", "", false},
		{"SB.p1.json", "", "", false},
		{"sb.p1.tmp.json", "", "", false},
	} {
		id, pid, ok := ParsePausedRecordName(tc.name)
		if ok != tc.ok || (ok && (id != tc.id || pid != tc.pid)) {
			t.Errorf("ParsePausedRecordName(%q) = %q, %q, %v; want %q, %q, %v", tc.name, id, pid, ok, tc.id, tc.pid, tc.ok)
		}
	}
}
