package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// packFixture is a "template" (a memory image and a small state file) on
// both hosts, and a "capture" of it on the sender: some pages changed,
// one chunk rewritten whole, data added where the template has a hole.
type packFixture struct {
	src, dst   string            // the sender's and receiver's directories
	files      map[string]string // the capture's files
	srcBases   map[string]Seed
	dstSeeds   []Seed
	changedMem int // bytes of vm.mem that differ from the template's
}

func newPackFixture(t *testing.T) packFixture {
	t.Helper()
	ctx := context.Background()
	fx := packFixture{src: t.TempDir(), dst: t.TempDir(), files: map[string]string{}}
	// The template, identical on both hosts: 12 chunks, data in 0-7.
	tmpl := filepath.Join(fx.src, "tmpl", "vm.mem")
	os.MkdirAll(filepath.Dir(tmpl), 0o700)
	testkit.WriteSparse(t, tmpl, 12*cs, 7, [2]int64{0, 8 * cs})
	dstTmpl := filepath.Join(fx.dst, "tmpl", "vm.mem")
	os.MkdirAll(filepath.Dir(dstTmpl), 0o700)
	copyFile(t, tmpl, dstTmpl)

	capt := filepath.Join(fx.src, "vm.mem")
	copyFile(t, tmpl, capt)
	f, err := os.OpenFile(capt, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Three pages of chunk 1, one of chunk 5 (a zero page over data).
	for _, off := range []int64{cs + 0, cs + 8*pageSize, cs + 100*pageSize} {
		f.WriteAt(bytes.Repeat([]byte{0xab}, pageSize), off)
	}
	f.WriteAt(make([]byte, pageSize), 5*cs+3*pageSize)
	// Chunk 3 rewritten whole; two pages in chunk 10 (a hole of the
	// template).
	f.WriteAt(bytes.Repeat([]byte{0x5c}, cs), 3*cs)
	f.WriteAt(bytes.Repeat([]byte{0x11}, 2*pageSize), 10*cs+4*pageSize)
	f.Close()
	fx.changedMem = 4*pageSize + cs + 2*pageSize
	fx.files["vm.mem"] = capt
	state := filepath.Join(fx.src, "vm.state")
	if err := os.WriteFile(state, bytes.Repeat([]byte("device state "), 3000), 0o600); err != nil {
		t.Fatal(err)
	}
	fx.files["vm.state"] = state

	idx, err := HashFile(ctx, tmpl, cs)
	if err != nil {
		t.Fatal(err)
	}
	fx.srcBases = map[string]Seed{"vm.mem": SeedOf(tmpl, cs, idx)}
	fx.dstSeeds = []Seed{SeedOf(dstTmpl, cs, idx)}
	return fx
}

func (fx packFixture) write(t *testing.T) ([]byte, PackStats) {
	t.Helper()
	var b bytes.Buffer
	st, err := WritePack(context.Background(), &b, fx.files, PackOptions{ChunkSize: cs, Meta: []byte(`{"id":"x"}`), Bases: fx.srcBases})
	if err != nil {
		t.Fatalf("WritePack: %v", err)
	}
	if st.Bytes != int64(b.Len()) {
		t.Errorf("stats say %d bytes, wrote %d", st.Bytes, b.Len())
	}
	return b.Bytes(), st
}

// read receives pack into a fresh directory.
func (fx packFixture) read(t *testing.T, pack []byte, seeds []Seed) (string, PackHeader, PackStats, error) {
	t.Helper()
	dir, err := os.MkdirTemp(fx.dst, "recv-")
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(bytes.NewReader(pack))
	h, err := ReadPackHeader(r)
	if err != nil {
		return dir, h, PackStats{}, err
	}
	st, err := ReadPack(context.Background(), r, h, dir, seeds)
	return dir, h, st, err
}

// TestPackRoundTrip: a pack rebuilds the capture's files byte for byte,
// and carries only what differs from the receiver's base: the changed
// pages, the chunk rewritten whole, and the small file.
func TestPackRoundTrip(t *testing.T) {
	t.Parallel() // a store of its own
	fx := newPackFixture(t)
	pack, st := fx.write(t)
	dir, h, rst, err := fx.read(t, pack, fx.dstSeeds)
	if err != nil {
		t.Fatalf("ReadPack: %v", err)
	}
	if string(h.Meta) != `{"id":"x"}` || h.Base == "" {
		t.Errorf("header meta %s base %q, want the sender's meta and a base digest", h.Meta, h.Base)
	}
	for name, path := range fx.files {
		want, _ := os.ReadFile(path)
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: received %d bytes (err %v), not the sent %d", name, len(got), err, len(want))
		}
	}
	// vm.mem: 12 chunks; 0,2,4,6,7 the base's; 1, 5 and 10 patches; 3
	// whole; 8, 9, 11 zeros. vm.state: one whole chunk.
	if st.BaseChunks != 5 || st.PatchChunks != 3 || st.WholeChunks != 2 || st.ZeroChunks != 3 {
		t.Errorf("sent %d base, %d patch, %d whole, %d zero chunks; want 5, 3, 2, 3", st.BaseChunks, st.PatchChunks, st.WholeChunks, st.ZeroChunks)
	}
	if rst.Bytes != st.Bytes {
		t.Errorf("received %d bytes, sent %d", rst.Bytes, st.Bytes)
	}
	if rst.BaseChunks != st.BaseChunks || rst.PatchChunks != st.PatchChunks || rst.WholeChunks != st.WholeChunks || rst.ZeroChunks != st.ZeroChunks {
		t.Errorf("received %+v, sent %+v", rst, st)
	}
	stateSize := int64(len("device state ") * 3000)
	want := int64(fx.changedMem) + stateSize
	if st.Bytes < want || st.Bytes > want+8<<10 {
		t.Errorf("pack of %d bytes, want the %d bytes that differ (and little more)", st.Bytes, want)
	}
	t.Logf("pack: %d bytes for %d changed; %+v", st.Bytes, want, st)
}

// TestPackRejectsDamage: a pack cut short anywhere, or with any byte
// changed, is refused with ErrPack.
func TestPackRejectsDamage(t *testing.T) {
	t.Parallel() // a store of its own
	fx := newPackFixture(t)
	pack, _ := fx.write(t)
	cuts := []int{0, 3, 20, len(pack) / 3, len(pack) / 2, len(pack) - 20, len(pack) - 5, len(pack) - 1}
	for _, n := range cuts {
		_, _, _, err := fx.read(t, pack[:n], fx.dstSeeds)
		if !errors.Is(err, ErrPack) {
			t.Errorf("pack cut to %d of %d bytes: got %v, want ErrPack", n, len(pack), err)
		}
	}
	for _, at := range []int{2, 9, 30, len(pack) / 4, len(pack) / 2, len(pack) - 40, len(pack) - 3} {
		bad := bytes.Clone(pack)
		bad[at] ^= 0x40
		_, _, _, err := fx.read(t, bad, fx.dstSeeds)
		if !errors.Is(err, ErrPack) {
			t.Errorf("byte %d of %d changed: got %v, want ErrPack", at, len(pack), err)
		}
	}
	// Trailing bytes after the trailer are not read: the pack ends there.
	if _, _, _, err := fx.read(t, append(bytes.Clone(pack), "junk"...), fx.dstSeeds); err != nil {
		t.Errorf("pack followed by junk: %v", err)
	}
}

// TestPackRefusesOtherBase: a receiver without the sender's base (none,
// or another copy) refuses the pack before writing any chunk.
func TestPackRefusesOtherBase(t *testing.T) {
	t.Parallel() // a store of its own
	fx := newPackFixture(t)
	pack, _ := fx.write(t)
	other := filepath.Join(fx.dst, "other.mem")
	testkit.WriteSparse(t, other, 12*cs, 99, [2]int64{0, 8 * cs})
	idx, err := HashFile(context.Background(), other, cs)
	if err != nil {
		t.Fatal(err)
	}
	otherSeed := SeedOf(other, cs, idx)
	otherSeed.Path = filepath.Join(fx.dst, "x", "vm.mem") // same name, other bytes
	otherSeed.File, _ = os.Open(other)
	defer otherSeed.File.Close()
	for _, c := range []struct {
		name  string
		seeds []Seed
	}{{"no template", nil}, {"another bake", []Seed{otherSeed}}} {
		dir, _, _, err := fx.read(t, pack, c.seeds)
		if !errors.Is(err, ErrPackBase) {
			t.Errorf("%s: got %v, want ErrPackBase", c.name, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "vm.mem")); err == nil {
			t.Errorf("%s: a file was written before the refusal", c.name)
		}
	}
}

// TestSharedRuns: the parts of a range two files map to the same disk
// blocks, however their extents are split.
func TestSharedRuns(t *testing.T) {
	t.Parallel() // a store of its own
	e := func(l, p, n int64) extent { return extent{logical: l, physical: p, length: n} }
	for _, c := range []struct {
		name   string
		a, b   extentMap
		off, n int64
		want   []extent
	}{
		{"all shared", extentMap{e(0, 1000, 100)}, extentMap{e(0, 1000, 100)}, 0, 100, []extent{e(0, 0, 100)}},
		{"split differently", extentMap{e(0, 1000, 40), e(40, 1040, 60)}, extentMap{e(0, 1000, 100)}, 10, 80, []extent{e(10, 0, 80)}},
		{"a middle rewritten", extentMap{e(0, 1000, 30), e(30, 5000, 20), e(50, 1050, 50)}, extentMap{e(0, 1000, 100)}, 0, 100,
			[]extent{e(0, 0, 30), e(50, 0, 50)}},
		{"a hole in a", extentMap{e(0, 1000, 30), e(60, 1060, 40)}, extentMap{e(0, 1000, 100)}, 0, 100, []extent{e(0, 0, 30), e(60, 0, 40)}},
		{"other blocks", extentMap{e(0, 2000, 100)}, extentMap{e(0, 1000, 100)}, 0, 100, nil},
		{"unknown map", nil, extentMap{e(0, 1000, 100)}, 0, 100, nil},
	} {
		got := sharedRuns(c.a, c.b, c.off, c.n)
		if len(got) != len(c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i].logical != c.want[i].logical || got[i].length != c.want[i].length {
				t.Errorf("%s: got %v, want %v", c.name, got, c.want)
				break
			}
		}
	}
}

// TestPackFilesDone: ReadPackNotify says when each file is complete —
// vm.mem (the first) before vm.state's record is read, every file at the
// end — and refuses a record of a file it has said was complete (what it
// said is then void: the pack fails).
func TestPackFilesDone(t *testing.T) {
	t.Parallel() // a store of its own
	fx := newPackFixture(t)
	pack, _ := fx.write(t)
	readNotify := func(pack []byte, check bool) (string, []int, error) {
		dir := t.TempDir()
		r := bufio.NewReader(bytes.NewReader(pack))
		h, err := ReadPackHeader(r)
		if err != nil {
			t.Fatal(err)
		}
		var calls []int
		_, err = ReadPackNotify(context.Background(), r, h, dir, fx.dstSeeds, func(n int) {
			calls = append(calls, n)
			for _, f := range h.Files[:n] {
				if !check {
					break
				}
				want, _ := os.ReadFile(fx.files[f.Name])
				if got, err := os.ReadFile(filepath.Join(dir, f.Name)); err != nil || !bytes.Equal(got, want) {
					t.Errorf("told %d files are done: %s is not complete (%d of %d bytes, err %v)", n, f.Name, len(got), len(want), err)
				}
			}
		})
		return dir, calls, err
	}
	_, calls, err := readNotify(pack, true)
	if err != nil {
		t.Fatalf("ReadPackNotify: %v", err)
	}
	if !slices.Equal(calls, []int{1, 2}) {
		t.Errorf("files done %v, want [1 2] (vm.mem, then both)", calls)
	}

	// The same records with vm.state's first: each record intact, the
	// count right, but vm.mem's records then come after vm.state began.
	hdrLen := 12 + int(binary.LittleEndian.Uint32(pack[8:])) + 4
	var recs [][]byte
	for off := hdrLen; off < len(pack); {
		n := 10 + int(binary.LittleEndian.Uint32(pack[off+6:])) + 4
		recs = append(recs, pack[off:off+n])
		off += n
	}
	last := len(recs) - 2 // before the trailer: vm.state's only record
	if recs[last][1] != 1 {
		t.Fatalf("record %d is of file %d, want vm.state's", last, recs[last][1])
	}
	bad := slices.Clone(pack[:hdrLen])
	bad = append(bad, recs[last]...)
	for _, rec := range append(slices.Clone(recs[:last]), recs[last+1]) {
		bad = append(bad, rec...)
	}
	if _, _, err := readNotify(bad, false); !errors.Is(err, ErrPack) {
		t.Errorf("records out of file order: got %v, want ErrPack", err)
	}
}
