package chunkstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

const cs = 1 << 20 // chunk size of the tests: small files, many chunks

var backends = []struct {
	name string
	open func(t *testing.T) objstore.Store
}{
	{"dir", func(t *testing.T) objstore.Store {
		s, err := objstore.OpenDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"s3", func(t *testing.T) objstore.Store { return s3test.Start(t).Open("art") }},
}

func newStore(t *testing.T, objs objstore.Store) *Store {
	t.Helper()
	cache, err := OpenCache(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(objs, Config{ChunkSize: cs, Workers: 3, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func forEachBackend(t *testing.T, f func(t *testing.T, s *Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, newStore(t, b.open(t))) })
	}
}

func countChunks(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	for _, err := range s.objs.List(context.Background(), "chunks/") {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return n
}

func sameFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from what was uploaded (%d bytes, want %d)", filepath.Base(path), len(got), len(want))
	}
}

func TestChunkstore(t *testing.T) {
	t.Parallel() // a store of its own
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		src := t.TempDir()

		// 24 MiB memory image: data in chunks 0, 5-6 (a range across a
		// boundary), a zero-filled (not hole) chunk 10, and 4 KiB in 20.
		// 24 chunks: 4 with data, 20 zero.
		mem := filepath.Join(src, "vm.mem")
		memData := testkit.MakeSparse(t, mem, 24*cs, 1, [2]int64{0, 100 << 10}, [2]int64{5*cs + 7, cs + 100}, [2]int64{20 * cs, 4096})
		func() { // a chunk of written zeros: read, found zero, not stored
			f, _ := os.OpenFile(mem, os.O_WRONLY, 0)
			defer f.Close()
			f.WriteAt(make([]byte, cs), 10*cs)
		}()
		state := filepath.Join(src, "vm.state")
		stateData := testkit.MakeSparse(t, state, 12345, 2, [2]int64{0, 12345})

		var calls int
		m, st, err := s.Upload(ctx, "snap/a", map[string]string{"vm.mem": mem, "vm.state": state}, func(Stats) { calls++ })
		if err != nil {
			t.Fatal(err)
		}
		want := Stats{ChunksTotal: 25, ChunksDone: 25, ChunksUploaded: 4 + 1, ZeroChunks: 20, BytesTotal: 24*cs + 12345, BytesUploaded: 4*cs + 12345}
		if st.SetupDur <= 0 || st.ChunksDur <= 0 || st.ManifestDur <= 0 {
			t.Errorf("first upload: durations of its steps %v, %v, %v: want all above 0", st.SetupDur, st.ChunksDur, st.ManifestDur)
		}
		if st = untimed(st); st != want {
			t.Errorf("first upload: Stats = %+v\nwant %+v", st, want)
		}
		if calls != 25 {
			t.Errorf("progress called %d times, want 25", calls)
		}
		if n := countChunks(t, s); n != 5 {
			t.Errorf("store holds %d chunks, want 5 (zero chunks are not stored)", n)
		}
		if f, _ := m.File("vm.mem"); f.Chunks[10] != "" || f.Chunks[1] != "" || f.Chunks[5] == "" {
			t.Errorf("manifest chunks of vm.mem = %q", f.Chunks)
		}

		t.Run("sparse round trip", func(t *testing.T) {
			dst := t.TempDir()
			if _, err := s.Download(ctx, "snap/a", dst); err != nil {
				t.Fatal(err)
			}
			sameFile(t, filepath.Join(dst, "vm.mem"), memData)
			sameFile(t, filepath.Join(dst, "vm.state"), stateData)
			// Data is 100 KiB + 1 MiB+100 + 4 KiB; holes stay holes (and
			// zero pages inside chunks become holes too).
			if got, limit := testkit.Allocated(t, filepath.Join(dst, "vm.mem")), int64(cs+256<<10); got > limit {
				t.Errorf("restored vm.mem allocates %d bytes, want at most %d (holes filled?)", got, limit)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 2 {
				t.Errorf("download dir holds %d entries, want 2 (no temporary files)", len(ents))
			}
		})

		// A second snapshot of the same lineage: one byte changed in
		// chunk 20 and data written into the hole of chunk 15.
		memB := filepath.Join(src, "vm.mem.b")
		memBData := bytes.Clone(memData)
		memBData[20*cs+9] ^= 0xff
		copy(memBData[15*cs:], bytes.Repeat([]byte{7}, 300))
		if err := os.WriteFile(memB, memBData, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Run("second upload sends only changed chunks", func(t *testing.T) {
			_, st, err := s.Upload(ctx, "snap/b", map[string]string{"vm.mem": memB, "vm.state": state}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Chunks 0, 5, 6 and vm.state are shared; 15 and 20 are new.
			// memB was written whole (no holes), so its zero chunks are read.
			want := Stats{ChunksTotal: 25, ChunksDone: 25, ChunksUploaded: 2, ChunksShared: 4, ZeroChunks: 19, BytesTotal: 24*cs + 12345, BytesUploaded: 2 * cs}
			if st = untimed(st); st != want {
				t.Errorf("second upload: Stats = %+v\nwant %+v", st, want)
			}
			if n := countChunks(t, s); n != 7 {
				t.Errorf("store holds %d chunks, want 7", n)
			}
		})

		t.Run("lazy open fetches touched chunks only", func(t *testing.T) {
			r, err := s.Open(ctx, "snap/b", "vm.mem")
			if err != nil {
				t.Fatal(err)
			}
			if r.Size() != 24*cs {
				t.Errorf("Size = %d", r.Size())
			}
			before := s.cfg.Cache.Stats()
			reads := []struct{ off, n int64 }{
				{6*cs - 10, 20},     // chunks 5 and 6
				{10*cs + 5, 1000},   // a zero chunk: no fetch
				{6*cs + 1000, 4096}, // chunk 6 again: cached
				{15 * cs, 300},      // chunk 15
			}
			for _, rd := range reads {
				buf := make([]byte, rd.n)
				if _, err := r.ReadAt(buf, rd.off); err != nil {
					t.Fatalf("ReadAt(%d, %d): %v", rd.off, rd.n, err)
				}
				if !bytes.Equal(buf, memBData[rd.off:rd.off+rd.n]) {
					t.Errorf("ReadAt(%d, %d) returned other bytes than the file's", rd.off, rd.n)
				}
			}
			got := s.cfg.Cache.Stats()
			if f := got.Fetches - before.Fetches; f != 3 {
				t.Errorf("fetched %d chunks, want 3 (5, 6, 15)", f)
			}
			if h := got.Hits - before.Hits; h != 1 {
				t.Errorf("cache hits = %d, want 1", h)
			}
			// Past the end: short read with EOF.
			buf := make([]byte, 100)
			if n, err := r.ReadAt(buf, 24*cs-10); n != 10 || err == nil {
				t.Errorf("ReadAt at the end = %d, %v; want 10, EOF", n, err)
			}
		})

		t.Run("delete and gc keep shared chunks", func(t *testing.T) {
			if err := s.Delete(ctx, "snap/a"); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(ctx, "snap/a"); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("second Delete = %v, want ErrNotFound", err)
			}
			if _, err := s.Download(ctx, "snap/a", t.TempDir()); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("Download of a deleted set = %v, want ErrNotFound", err)
			}
			removed, err := s.GC(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// Only snap/a's version of chunk 20 was its alone.
			if removed != 1 {
				t.Errorf("GC removed %d chunks, want 1", removed)
			}
			if removed, err := s.GC(ctx); removed != 0 || err != nil {
				t.Errorf("second GC = %d, %v; want 0", removed, err)
			}
			dst := t.TempDir()
			if _, err := s.Download(ctx, "snap/b", dst); err != nil {
				t.Fatal(err)
			}
			sameFile(t, filepath.Join(dst, "vm.mem"), memBData)
			sameFile(t, filepath.Join(dst, "vm.state"), stateData)
			if names, err := s.Names(ctx); err != nil || strings.Join(names, " ") != "snap/b" {
				t.Errorf("Names = %v, %v; want [snap/b]", names, err)
			}
			if keys := leaseKeys(t, s); len(keys) != 0 {
				t.Errorf("leases left behind: %v", keys)
			}
		})
	})
}

func leaseKeys(t *testing.T, s *Store) []string {
	t.Helper()
	var keys []string
	for in, err := range s.objs.List(context.Background(), "leases/") {
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, in.Key)
	}
	return keys
}

// garbage uploads file src as set name and deletes the set: its chunks
// are left for GC.
func garbage(t *testing.T, s *Store, name, src string) {
	t.Helper()
	ctx := context.Background()
	if _, _, err := s.Upload(ctx, name, map[string]string{"f": src}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
}

// GC and Upload exclude each other through leases (package doc).
func TestLeases(t *testing.T) {
	t.Parallel() // a store of its own
	objs, err := objstore.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, objs)
	s.pollEvery = 10 * time.Millisecond
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "f")
	data := testkit.MakeSparse(t, src, 3*cs, 3, [2]int64{0, 3 * cs})
	garbage(t, s, "x", src)

	// An upload in progress: GC deletes nothing.
	up, err := s.acquire(ctx, "upload")
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := s.GC(ctx); !errors.Is(err, ErrBusy) || removed != 0 {
		t.Errorf("GC during an upload = %d, %v; want 0, ErrBusy", removed, err)
	}
	if n := countChunks(t, s); n != 3 {
		t.Errorf("after a busy GC the store holds %d chunks, want 3", n)
	}
	up.release(ctx)

	// A GC in progress: Upload waits for it (here until its deadline)
	// and writes nothing.
	gc, err := s.acquire(ctx, "gc")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, _, err = s.Upload(wctx, "y", map[string]string{"f": src}, nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Upload during a GC = %v, want it to wait until its deadline", err)
	}
	if _, err := s.Manifest(ctx, "y"); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("manifest of the waiting upload: %v, want ErrNotFound", err)
	}
	gc.release(ctx)

	// A lease that stopped being renewed (its holder died) is ignored,
	// and GC removes it.
	stale := "leases/upload-dead"
	if err := objs.Put(ctx, stale, strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * s.cfg.LeaseTTL)
	if err := os.Chtimes(filepath.Join(objs.Root(), stale), old, old); err != nil {
		t.Fatal(err)
	}
	if removed, err := s.GC(ctx); err != nil || removed != 3 {
		t.Errorf("GC with a dead upload lease = %d, %v; want 3, nil", removed, err)
	}
	if keys := leaseKeys(t, s); len(keys) != 0 {
		t.Errorf("leases after GC: %v, want none", keys)
	}
	// And the set uploads again whole.
	_, st, err := s.Upload(ctx, "y", map[string]string{"f": src}, nil)
	if err != nil || st.ChunksUploaded != 3 {
		t.Errorf("Upload after GC = %+v, %v; want 3 chunks uploaded", st, err)
	}
	dst := t.TempDir()
	if _, err := s.Download(ctx, "y", dst); err != nil {
		t.Fatal(err)
	}
	sameFile(t, filepath.Join(dst, "f"), data)
}

// Leases their holders could not delete do not hold GC off for LeaseTTL:
// one whose delete failed (the store was down as its holder released it)
// goes before the Store's next lease; those an earlier process of the
// Store's Owner left go before its first. Another owner's stay.
func TestLeasesLeftBehind(t *testing.T) {
	t.Parallel() // a store of its own
	srv := s3test.Start(t)
	objs := srv.Open("leases")
	ctx := context.Background()
	open := func(owner string) *Store {
		s, err := New(objs, Config{ChunkSize: cs, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if _, err := New(objs, Config{Owner: "host-1"}); err == nil {
		t.Error("New with owner \"host-1\" succeeded; want an error (letters and digits only)")
	}
	s := open("h1")
	src := filepath.Join(t.TempDir(), "f")
	testkit.WriteSparse(t, src, 2*cs, 7, [2]int64{0, 2 * cs})
	garbage(t, s, "x", src)

	// Released while the store is down: the lease stays in the store.
	up, err := s.acquire(ctx, "upload")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(up.key, "leases/upload-h1-") {
		t.Errorf("lease key %q: want the owner in it", up.key)
	}
	srv.Stop()
	up.release(ctx)
	srv.Restart()
	if keys := leaseKeys(t, s); len(keys) != 1 || keys[0] != up.key {
		t.Fatalf("leases after a release with the store down: %v, want %s", keys, up.key)
	}
	if removed, err := s.GC(ctx); err != nil || removed != 2 {
		t.Errorf("GC after a release that could not delete its lease = %d, %v; want 2, nil", removed, err)
	}

	// An earlier process of owner h1 left a lease (it crashed: never
	// released); so did a live process of owner h2.
	garbage(t, s, "y", src)
	crashed, err := s.acquire(ctx, "upload")
	if err != nil {
		t.Fatal(err)
	}
	close(crashed.stop) // stops renewing, never deletes
	<-crashed.done
	other, err := open("h2").acquire(ctx, "upload")
	if err != nil {
		t.Fatal(err)
	}
	again := open("h1")
	if _, err := again.GC(ctx); !errors.Is(err, ErrBusy) || strings.Contains(err.Error(), crashed.key) {
		t.Errorf("GC with h2's upload in progress = %v; want ErrBusy naming h2's lease only", err)
	}
	if keys := leaseKeys(t, s); len(keys) != 1 || keys[0] != other.key {
		t.Errorf("leases after the next h1 process's first GC: %v, want h2's only", keys)
	}
	other.release(ctx)
	if removed, err := again.GC(ctx); err != nil || removed != 2 {
		t.Errorf("GC once h2's upload ended = %d, %v; want 2, nil", removed, err)
	}
}

// A store that is down: every operation is ErrUnavailable; once it is
// back, nothing is lost and the failed upload succeeds when tried again.
func TestStoreDown(t *testing.T) {
	t.Parallel() // a store of its own
	srv := s3test.Start(t)
	s := newStore(t, srv.Open("down"))
	ctx := context.Background()
	src := t.TempDir()
	a := filepath.Join(src, "a")
	aData := testkit.MakeSparse(t, a, 4*cs, 4, [2]int64{0, 4 * cs})
	if _, _, err := s.Upload(ctx, "a", map[string]string{"f": a}, nil); err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(src, "b")
	testkit.WriteSparse(t, b, 2*cs, 5, [2]int64{0, 2 * cs})
	r, err := s.Open(ctx, "a", "f")
	if err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	if _, _, err := s.Upload(ctx, "b", map[string]string{"f": b}, nil); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Upload with the store down = %v, want ErrUnavailable", err)
	}
	if _, err := s.Download(ctx, "a", t.TempDir()); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Download with the store down = %v, want ErrUnavailable", err)
	}
	if _, err := r.ReadAt(make([]byte, 10), cs); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("ReadAt of an uncached chunk with the store down = %v, want ErrUnavailable", err)
	}
	if _, err := s.GC(ctx); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("GC with the store down = %v, want ErrUnavailable", err)
	}

	srv.Restart()
	dst := t.TempDir()
	if _, err := s.Download(ctx, "a", dst); err != nil {
		t.Fatal(err)
	}
	sameFile(t, filepath.Join(dst, "f"), aData)
	buf := make([]byte, 10)
	if _, err := r.ReadAt(buf, cs); err != nil || !bytes.Equal(buf, aData[cs:cs+10]) {
		t.Errorf("ReadAt after restart = %v; or other bytes", err)
	}
	if _, st, err := s.Upload(ctx, "b", map[string]string{"f": b}, nil); err != nil || st.ChunksUploaded+st.ChunksShared != 2 {
		t.Errorf("Upload after restart = %+v, %v", st, err)
	}
}

func TestNewAndNames(t *testing.T) {
	t.Parallel() // a store of its own
	objs, _ := objstore.OpenDir(t.TempDir())
	for _, cfg := range []Config{{ChunkSize: 1000}, {ChunkSize: 128 << 20}, {Workers: -1}, {LeaseTTL: time.Millisecond}} {
		if _, err := New(objs, cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
	s := newStore(t, objs)
	ctx := context.Background()
	f := filepath.Join(t.TempDir(), "f")
	testkit.WriteSparse(t, f, 10, 1, [2]int64{0, 10})
	for _, tt := range []struct {
		name  string
		files map[string]string
	}{
		{"../x", map[string]string{"f": f}},
		{"x", map[string]string{"a/b": f}},
		{"x", map[string]string{".f": f}},
		{"x", map[string]string{"f": filepath.Join(t.TempDir(), "missing")}},
	} {
		if _, _, err := s.Upload(ctx, tt.name, tt.files, nil); err == nil {
			t.Errorf("Upload(%q, %v) succeeded", tt.name, tt.files)
		}
	}
	if _, err := s.Open(ctx, "nope", "f"); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("Open of a missing set = %v, want ErrNotFound", err)
	}
	for _, meta := range []json.RawMessage{json.RawMessage(`{"a":`), json.RawMessage(`"` + strings.Repeat("x", MaxMeta) + `"`)} {
		if _, _, err := s.UploadMeta(ctx, "x", map[string]string{"f": f}, meta, nil); err == nil {
			t.Errorf("UploadMeta with metadata %.20q… (%d bytes) succeeded", meta, len(meta))
		}
	}
}

// TestMeta: the metadata given to UploadMeta comes back in the manifest;
// Upload writes none; a new upload of the set replaces it.
func TestMeta(t *testing.T) {
	t.Parallel() // a store of its own
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		f := filepath.Join(t.TempDir(), "f")
		testkit.WriteSparse(t, f, 10, 1, [2]int64{0, 10})
		for _, meta := range []json.RawMessage{json.RawMessage(`{"id":"a","n":1}`), json.RawMessage(`{"id":"a","n":2}`), nil} {
			if _, _, err := s.UploadMeta(ctx, "paused/a", map[string]string{"f": f}, meta, nil); err != nil {
				t.Fatal(err)
			}
			m, err := s.Manifest(ctx, "paused/a")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(m.Meta, meta) {
				t.Errorf("Meta = %s, want %s", m.Meta, meta)
			}
		}
	})
}

// untimed is st without the durations of its steps, to compare counts.
func untimed(st Stats) Stats {
	st.SetupDur, st.ChunksDur, st.ManifestDur = 0, 0, 0
	return st
}

// An upload IfAbsent writes its manifest only where the set is not:
// of two hosts uploading a set at once, the first one's stays.
func TestUploadIfAbsent(t *testing.T) {
	t.Parallel() // a store of its own
	forEachBackend(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		f := filepath.Join(t.TempDir(), "f")
		testkit.WriteSparse(t, f, 3*cs, 1, [2]int64{0, 3 * cs})
		g := filepath.Join(t.TempDir(), "f")
		testkit.WriteSparse(t, g, 3*cs, 2, [2]int64{0, 3 * cs})
		first, _, err := s.UploadWith(ctx, "templates/x", map[string]string{"f": f}, UploadOptions{Meta: json.RawMessage(`{"boot":"a"}`), IfAbsent: true}, nil)
		if err != nil {
			t.Fatalf("first upload: %v", err)
		}
		_, _, err = s.UploadWith(ctx, "templates/x", map[string]string{"f": g}, UploadOptions{Meta: json.RawMessage(`{"boot":"b"}`), IfAbsent: true}, nil)
		if !errors.Is(err, objstore.ErrExists) {
			t.Errorf("second upload IfAbsent: %v, want ErrExists", err)
		}
		m, err := s.Manifest(ctx, "templates/x")
		if err != nil {
			t.Fatal(err)
		}
		if string(m.Meta) != `{"boot":"a"}` || m.Files[0].Chunks[0] != first.Files[0].Chunks[0] {
			t.Errorf("after the refused upload the set is %s (chunk 0 %s), want the first's", m.Meta, m.Files[0].Chunks[0])
		}
		dst := t.TempDir()
		if _, err := s.Download(ctx, "templates/x", dst); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(f)
		sameFile(t, filepath.Join(dst, "f"), want)
		// Without IfAbsent the upload replaces the set.
		if _, _, err := s.UploadWith(ctx, "templates/x", map[string]string{"f": g}, UploadOptions{Meta: json.RawMessage(`{"boot":"b"}`)}, nil); err != nil {
			t.Fatal(err)
		}
		if m, err := s.Manifest(ctx, "templates/x"); err != nil || string(m.Meta) != `{"boot":"b"}` {
			t.Errorf("after a plain upload: %v, %v; want the set replaced", m, err)
		}
	})
}
