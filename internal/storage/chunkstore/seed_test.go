package chunkstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// countingStore counts the chunks read from the store it wraps.
type countingStore struct {
	objstore.Store
	chunkGets atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "chunks/") {
		c.chunkGets.Add(1)
	}
	return c.Store.Get(ctx, key)
}

// TestDownloadSeeded: a download takes the chunks a local seed holds from
// it (at any offset) and fetches only the others; a seed whose index is
// stale costs a fetch, not a wrong file.
func TestDownloadSeeded(t *testing.T) {
	t.Parallel() // a store of its own
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			objs := &countingStore{Store: b.open(t)}
			s := newStore(t, objs)
			src := t.TempDir()

			// The "template": 16 chunks, data in 0-5 and 9, holes elsewhere.
			tmpl := filepath.Join(src, "template.mem")
			testkit.WriteSparse(t, tmpl, 16*cs, 1, [2]int64{0, 6 * cs}, [2]int64{9 * cs, cs})
			// The "capture": the template with chunks 2 and 3 changed, data
			// added in 12, and the template's chunk 9 moved to chunk 14
			// (found by hash, wherever it is). 12.5 chunks long.
			capt := filepath.Join(src, "vm.mem")
			copyFile(t, tmpl, capt)
			f, err := os.OpenFile(capt, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			chunk9 := make([]byte, cs)
			f.ReadAt(chunk9, 9*cs)
			f.WriteAt(chunk9, 14*cs)
			f.WriteAt(make([]byte, cs), 9*cs) // written zeros
			f.WriteAt([]byte("changed"), 2*cs+100)
			f.WriteAt([]byte("changed too"), 3*cs+cs-20)
			f.WriteAt([]byte("new"), 12*cs)
			f.Truncate(14*cs + cs/2 + 4096) // the last chunk is short: chunk 14 is now partial...
			f.Close()
			want, _ := os.ReadFile(capt)
			m, _, err := s.Upload(ctx, "snap/c", map[string]string{"vm.mem": capt}, nil)
			if err != nil {
				t.Fatal(err)
			}
			idx, err := HashFile(ctx, tmpl, cs)
			if err != nil {
				t.Fatal(err)
			}
			if got := nonEmpty(idx.Chunks); got != 7 {
				t.Fatalf("index of the template has %d chunks with data, want 7", got)
			}

			objs.chunkGets.Store(0)
			dst := t.TempDir()
			st, err := s.DownloadSeeded(ctx, m, dst, []Seed{SeedOf(tmpl, cs, idx)})
			if err != nil {
				t.Fatal(err)
			}
			sameFile(t, filepath.Join(dst, "vm.mem"), want)
			// Chunks 0, 1, 4, 5 from the seed; 2, 3, 12 and the partial 14
			// (its hash is no longer the template's chunk 9) fetched.
			if st.ChunksSeeded != 4 || st.ChunksFetched != 4 || st.ZeroChunks != 7 || st.Chunks != 15 {
				t.Errorf("stats %+v, want 4 seeded, 4 fetched, 7 zero of 15", st)
			}
			if got := objs.chunkGets.Load(); got != 4 {
				t.Errorf("%d chunks read from the store, want 4", got)
			}
			if st.BytesSeeded != 4*cs || st.BytesFetched != 3*cs+cs/2+4096 {
				t.Errorf("bytes seeded %d, fetched %d; want %d, %d", st.BytesSeeded, st.BytesFetched, 4*cs, 3*cs+cs/2+4096)
			}

			// A seed found elsewhere: the template's chunk 9 at chunk 14 of
			// a capture of full length.
			capt2 := filepath.Join(src, "vm2.mem")
			copyFile(t, tmpl, capt2)
			f, _ = os.OpenFile(capt2, os.O_RDWR, 0)
			f.WriteAt(chunk9, 14*cs)
			f.Close()
			want2, _ := os.ReadFile(capt2)
			m2, _, err := s.Upload(ctx, "snap/d", map[string]string{"vm.mem": capt2}, nil)
			if err != nil {
				t.Fatal(err)
			}
			objs.chunkGets.Store(0)
			dst2 := t.TempDir()
			st, err = s.DownloadSeeded(ctx, m2, dst2, []Seed{SeedOf(tmpl, cs, idx)})
			if err != nil {
				t.Fatal(err)
			}
			sameFile(t, filepath.Join(dst2, "vm.mem"), want2)
			if st.ChunksSeeded != 8 || st.ChunksFetched != 0 || objs.chunkGets.Load() != 0 {
				t.Errorf("stats %+v (%d reads), want all 8 chunks seeded, none fetched", st, objs.chunkGets.Load())
			}

			// A stale index: the template changed behind it. A copied chunk
			// is checked and fetched instead; a reflinked one is trusted,
			// so this part runs where the file system cannot reflink.
			if cloned(t, src) {
				t.Log("the temporary directory reflinks: stale seeds are not detected there (by contract)")
				return
			}
			f, _ = os.OpenFile(tmpl, os.O_RDWR, 0)
			f.WriteAt([]byte("stale"), 0)
			f.Close()
			dst3 := t.TempDir()
			objs.chunkGets.Store(0)
			st, err = s.DownloadSeeded(ctx, m2, dst3, []Seed{SeedOf(tmpl, cs, idx)})
			if err != nil {
				t.Fatal(err)
			}
			sameFile(t, filepath.Join(dst3, "vm.mem"), want2)
			if st.ChunksSeeded != 7 || st.ChunksFetched != 1 || st.ChunksCloned != 0 {
				t.Errorf("stats %+v, want 7 seeded, 1 fetched (the stale chunk)", st)
			}

			// Seeds of another chunk size are not used.
			st, err = s.DownloadSeeded(ctx, m2, t.TempDir(), []Seed{{Path: tmpl, ChunkSize: 2 * cs, Chunks: idx.Chunks}})
			if err != nil {
				t.Fatal(err)
			}
			if st.ChunksSeeded != 0 || st.ChunksFetched != 8 {
				t.Errorf("stats %+v, want every chunk fetched", st)
			}
		})
	}
}

func nonEmpty(hs []string) (n int) {
	for _, h := range hs {
		if h != "" {
			n++
		}
	}
	return n
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// cloned reports whether dir's file system reflinks.
func cloned(t *testing.T, dir string) bool {
	a, b := filepath.Join(dir, ".probe-a"), filepath.Join(dir, ".probe-b")
	defer os.Remove(a)
	defer os.Remove(b)
	os.WriteFile(a, make([]byte, 4096), 0o600)
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Create(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	return unix.IoctlFileClone(int(fb.Fd()), int(fa.Fd())) == nil
}

// TestDeltas: an upload given the file a capture was made from as its
// base stores the chunks that differ from the base's in a few pages as
// patches of those pages (against zeros where the base has none), a
// chunk that differs a lot whole, and a chunk met twice the same way
// twice. Downloads with or without the base as a seed, and lazy reads,
// give the file back; garbage collection keeps the base chunks a delta
// needs after the base's own set is gone.
func TestDeltas(t *testing.T) {
	t.Parallel() // a store of its own
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			objs := &countingStore{Store: b.open(t)}
			s := newStore(t, objs)
			src := t.TempDir()

			tmpl := filepath.Join(src, "template.mem")
			testkit.WriteSparse(t, tmpl, 8*cs, 1, [2]int64{0, 5 * cs}) // chunks 5-7 holes
			// The template's chunk 4 is its chunk 1 (so is the capture's).
			func() {
				f, _ := os.OpenFile(tmpl, os.O_RDWR, 0)
				defer f.Close()
				c := make([]byte, cs)
				f.ReadAt(c, cs)
				f.WriteAt(c, 4*cs)
			}()
			if _, _, err := s.Upload(ctx, "templates/t", map[string]string{"vm.mem": tmpl}, nil); err != nil {
				t.Fatal(err)
			}
			idx, err := HashFile(ctx, tmpl, cs)
			if err != nil {
				t.Fatal(err)
			}
			capt := filepath.Join(src, "vm.mem")
			copyFile(t, tmpl, capt)
			f, _ := os.OpenFile(capt, os.O_RDWR, 0)
			page := func(chunk, p int, b byte) { f.WriteAt(bytes.Repeat([]byte{b}, 4096), int64(chunk)*cs+int64(p)*4096) }
			page(1, 0, 1)
			page(1, 7, 2) // chunk 1: 2 pages differ
			page(2, 100, 3)
			for p := range 200 { // chunk 3: 200 of 256 pages differ
				page(3, p, 4)
			}
			chunk1 := make([]byte, cs)
			f.ReadAt(chunk1, 1*cs)
			f.WriteAt(chunk1, 4*cs) // chunk 4 = chunk 1
			page(5, 3, 5)           // a page where the template has a hole
			f.Close()
			want, _ := os.ReadFile(capt)

			m, st, err := s.UploadWith(ctx, "snap/c", map[string]string{"vm.mem": capt}, UploadOptions{Bases: map[string]Seed{"vm.mem": SeedOf(tmpl, cs, idx)}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			fm, _ := m.File("vm.mem")
			if m.Version != 2 || len(fm.Deltas) != 4 || st.ChunksDelta != 3 || st.ChunksUploaded != 1 {
				t.Fatalf("manifest version %d, deltas %v, stats %+v; want version 2, deltas of chunks 1, 2, 4, 5, 3 patches and chunk 3 whole", m.Version, fm.Deltas, st)
			}
			if fm.Deltas[4] != fm.Deltas[1] || fm.Deltas[5].Base != "" || fm.Deltas[1].Base != idx.Chunks[1] {
				t.Errorf("deltas %v", fm.Deltas)
			}
			patches := st.BytesUploaded - cs
			if patches <= 0 || patches > 6*4096+100 {
				t.Errorf("patches of 4 changed pages took %d bytes", patches)
			}

			check := func(what string, seeds []Seed, wantFetched int64) {
				t.Helper()
				dst := t.TempDir()
				st, err := s.DownloadSeeded(ctx, m, dst, seeds)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				sameFile(t, filepath.Join(dst, "vm.mem"), want)
				if st.ChunksDelta != 4 || st.BytesFetched != wantFetched {
					t.Errorf("%s: stats %+v, want 4 deltas and %d bytes fetched", what, st, wantFetched)
				}
			}
			check("download seeded by the template", []Seed{SeedOf(tmpl, cs, idx)}, cs+patches+fileLen(t, objs, fm.Deltas[4].Patch))
			// Without: chunk 0 and the bases of 1, 2, 4 fetched whole.
			check("download without the template", nil, cs+patches+fileLen(t, objs, fm.Deltas[4].Patch)+4*cs)

			// The base's own set gone and garbage collected: the bases the
			// deltas need stay.
			if err := s.Delete(ctx, "templates/t"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.GC(ctx); err != nil {
				t.Fatal(err)
			}
			check("download after the template's set is gone", nil, cs+patches+fileLen(t, objs, fm.Deltas[4].Patch)+4*cs)
			r, err := s.Open(ctx, "snap/c", "vm.mem")
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(want))
			if _, err := r.ReadAt(got, 0); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Error("lazy read of a set with deltas differs from the file uploaded")
			}
			if err := s.Delete(ctx, "snap/c"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.GC(ctx); err != nil {
				t.Fatal(err)
			}
			if n := countChunks(t, s); n != 0 {
				t.Errorf("%d chunks left after every set is deleted and collected", n)
			}
		})
	}
}

func fileLen(t *testing.T, objs objstore.Store, hash string) int64 {
	in, err := objs.Stat(context.Background(), "chunks/"+hash)
	if err != nil {
		t.Fatal(err)
	}
	return in.Size
}

func TestSameBlocks(t *testing.T) {
	t.Parallel() // a store of its own
	tmpl := extentMap{{0, 1000, 100}, {100, 5000, 100}, {300, 9000, 100}}
	for _, tc := range []struct {
		name   string
		m      extentMap
		off, n int64
		want   bool
	}{
		{"same extents", tmpl, 0, 200, true},
		{"split differently", extentMap{{0, 1000, 50}, {50, 1050, 50}, {100, 5000, 100}}, 0, 200, true},
		{"one block rewritten", extentMap{{0, 1000, 50}, {50, 7777, 10}, {60, 1060, 40}, {100, 5000, 100}}, 0, 200, false},
		{"a hole in both", tmpl, 150, 200, false}, // not covered: read it
		{"past the rewrite", extentMap{{0, 1000, 50}, {50, 7777, 10}, {60, 1060, 40}, {100, 5000, 100}}, 100, 100, true},
		{"unknown map", nil, 0, 100, false},
	} {
		if got := sameBlocks(tc.m, tmpl, tc.off, tc.n); got != tc.want {
			t.Errorf("%s: sameBlocks = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// statCounter counts the chunks an upload asks the store about.
type statCounter struct {
	objstore.Store
	chunkStats atomic.Int64
}

func (c *statCounter) Stat(ctx context.Context, key string) (objstore.Info, error) {
	if strings.HasPrefix(key, "chunks/") {
		c.chunkStats.Add(1)
	}
	return c.Store.Stat(ctx, key)
}

// TestUploadKnown: an upload does not ask the store about the chunks of
// the sets it names as known (a capture's template), and still stores a
// set that downloads whole; a known set that does not exist changes
// nothing.
func TestUploadKnown(t *testing.T) {
	t.Parallel() // a store of its own
	objs := &statCounter{Store: backends[0].open(t)}
	s := newStore(t, objs)
	ctx := context.Background()
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "tmpl")
	testkit.WriteSparse(t, tmpl, 8*cs, 1, [2]int64{0, 6 * cs})
	if _, _, err := s.Upload(ctx, "templates/t", map[string]string{"vm.mem": tmpl}, nil); err != nil {
		t.Fatal(err)
	}
	// The capture: the template's first 6 chunks, and 2 of its own.
	capFile := filepath.Join(dir, "cap")
	b, _ := os.ReadFile(tmpl)
	b = append(b[:6*cs:6*cs], make([]byte, 2*cs)...)
	rand.New(rand.NewSource(2)).Read(b[6*cs:])
	if err := os.WriteFile(capFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		known      []string
		wantStats  int64
		wantShared int
	}{
		{[]string{"templates/t"}, 2, 6},       // only the capture's own chunks
		{[]string{"templates/missing"}, 8, 8}, // every chunk (all there now)
	} {
		objs.chunkStats.Store(0)
		name := "snapshots/" + strings.ReplaceAll(tc.known[0], "/", "-")
		_, st, err := s.UploadWith(ctx, name, map[string]string{"vm.mem": capFile}, UploadOptions{Known: tc.known}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := objs.chunkStats.Load(); got != tc.wantStats {
			t.Errorf("known %v: %d chunks looked up, want %d", tc.known, got, tc.wantStats)
		}
		if st.ChunksShared != tc.wantShared {
			t.Errorf("known %v: %d chunks shared, want %d", tc.known, st.ChunksShared, tc.wantShared)
		}
		out := filepath.Join(t.TempDir(), "out")
		if _, err := s.Download(ctx, name, out); err != nil {
			t.Fatal(err)
		}
		sameFile(t, filepath.Join(out, "vm.mem"), b)
	}
}

// headCounter counts the HEADs (Stat) of chunks and patches and the PUTs.
type headCounter struct {
	objstore.Store
	heads, puts atomic.Int64
}

func (c *headCounter) Stat(ctx context.Context, key string) (objstore.Info, error) {
	if strings.HasPrefix(key, "chunks/") {
		c.heads.Add(1)
	}
	return c.Store.Stat(ctx, key)
}

func (c *headCounter) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, "chunks/") {
		c.puts.Add(1)
	}
	return c.Store.Put(ctx, key, r, size)
}

// TestUploadPatchesWithoutHead: an upload with a base whose set is known
// stores a chunk that differs from its base in a few pages as a patch
// without asking the store about the chunk or the patch (a PUT of
// content-addressed data is idempotent; the lease keeps GC away), also
// when it is uploaded again; with a base the caller proved current
// (Seed.Current) it does the same, and the set downloads as it was.
func TestUploadPatchesWithoutHead(t *testing.T) {
	t.Parallel() // a store of its own
	objs := &headCounter{Store: backends[0].open(t)}
	s := newStore(t, objs)
	ctx := context.Background()
	// The capture: the template with 3 pages written in chunks 1 and 4
	// (a copy, not a reflink: every chunk is read).
	tmpl, idx, capFile, b := templateAndCapture(t, s, 6, 1*cs+4096, 1*cs+9*4096, 4*cs+2*4096)
	tf, err := os.Open(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	for i, sd := range []Seed{
		SeedOf(tmpl, cs, idx),
		SeedOf(tmpl, cs, idx), // again: the patches are in the store now
		{Path: tmpl, File: tf, ChunkSize: cs, Chunks: idx.Chunks, Current: true},
	} {
		objs.heads.Store(0)
		objs.puts.Store(0)
		name := fmt.Sprintf("snapshots/s%d", i)
		m, st, err := s.UploadWith(ctx, name, map[string]string{"vm.mem": capFile}, UploadOptions{Bases: map[string]Seed{"vm.mem": sd}, Known: []string{"templates/t"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		fm, _ := m.File("vm.mem")
		if st.ChunksDelta != 2 || st.ChunksShared != 4 || len(fm.Deltas) != 2 {
			t.Errorf("upload %d: stats %+v, deltas %v; want 2 patches and 4 chunks shared", i, st, fm.Deltas)
		}
		if got := objs.heads.Load(); got != 0 {
			t.Errorf("upload %d: %d chunks looked up, want 0", i, got)
		}
		if got := objs.puts.Load(); got != 2 {
			t.Errorf("upload %d: %d chunks put, want 2 (the patches)", i, got)
		}
		out := filepath.Join(t.TempDir(), "out")
		if _, err := s.Download(ctx, name, out); err != nil {
			t.Fatal(err)
		}
		sameFile(t, filepath.Join(out, "vm.mem"), b)
	}
}

// TestDownloadCurrentSeed: a download takes the base of a patch from a
// seed proven current without hashing it; if the seed was not what its
// index says after all, the chunk is made from the store's base instead,
// never written wrong.
func TestDownloadCurrentSeed(t *testing.T) {
	t.Parallel() // a store of its own
	s := newStore(t, backends[0].open(t))
	ctx := context.Background()
	tmpl, idx, capFile, b := templateAndCapture(t, s, 4, 2*cs+4096) // chunk 2: one page
	dir := t.TempDir()
	m, st, err := s.UploadWith(ctx, "snapshots/c", map[string]string{"vm.mem": capFile}, UploadOptions{Bases: map[string]Seed{"vm.mem": SeedOf(tmpl, cs, idx)}, Known: []string{"templates/t"}}, nil)
	if err != nil || st.ChunksDelta != 1 {
		t.Fatalf("upload: stats %+v, %v; want one patch", st, err)
	}
	// A seed whose chunk 2 is not what the index says (the template
	// changed behind it), claimed current.
	stale := filepath.Join(dir, "stale")
	sb, _ := os.ReadFile(tmpl)
	copy(sb[2*cs+8*4096:], bytes.Repeat([]byte{0xee}, 4096))
	if err := os.WriteFile(stale, sb, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what        string
		path        string
		wantFetched bool // the base of chunk 2 came from the store
	}{
		{"current seed", tmpl, false},
		{"current seed that lies", stale, true},
	} {
		f, err := os.Open(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "out")
		dst, err := s.DownloadSeeded(ctx, m, out, []Seed{{Path: tc.path, File: f, ChunkSize: cs, Chunks: idx.Chunks, Current: true}})
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		sameFile(t, filepath.Join(out, "vm.mem"), b)
		if got := dst.BytesFetched >= cs; got != tc.wantFetched {
			t.Errorf("%s: %d bytes fetched; base fetched %v, want %v", tc.what, dst.BytesFetched, got, tc.wantFetched)
		}
	}
}

// templateAndCapture writes a template of n chunks of data, uploads it as
// templates/t and indexes it, and writes a capture of it with a page of
// 0xa5 at each of pages (offsets); it returns their paths, the index and
// the capture's bytes.
func templateAndCapture(t *testing.T, s *Store, n int64, pages ...int64) (tmpl string, idx File, capFile string, b []byte) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	tmpl = filepath.Join(dir, "tmpl")
	testkit.WriteSparse(t, tmpl, n*cs, 1, [2]int64{0, n * cs})
	if _, _, err := s.Upload(ctx, "templates/t", map[string]string{"vm.mem": tmpl}, nil); err != nil {
		t.Fatal(err)
	}
	idx, err := HashFile(ctx, tmpl, cs)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(tmpl)
	for _, off := range pages {
		copy(b[off:off+4096], bytes.Repeat([]byte{0xa5}, 4096))
	}
	capFile = filepath.Join(dir, "cap")
	if err := os.WriteFile(capFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return tmpl, idx, capFile, b
}
