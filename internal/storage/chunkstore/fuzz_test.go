package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// fuzzChunk is the chunk size of the fuzz targets' packs: two pages, so
// that short inputs hold several chunks.
const fuzzChunk = 2 * pageSize

// FuzzReadPack receives arbitrary packs, as a host receives one from
// another host (the host API's direct transfer of a capture), and checks:
// a pack is refused only as ErrPack or ErrPackBase (or an I/O error of
// this host's); the files it writes are the header's, in the receiving
// directory, and nothing else changes (the base it reads from included);
// an accepted pack's files have their sizes and the contents a model of
// the records makes; and any pack WritePack makes from the input's bytes
// reads back byte for byte, with the same counts on both sides.
//
// The stream is assembled from the input so that the fuzzer reaches the
// records rather than the checksums: header is the header's JSON, records
// a list of instructions (fuzzRecords) that the harness frames with
// correct CRCs, base the receiver's base file; mode's low bits corrupt the
// stream (a record's CRC, the trailer) or feed header as the raw stream.
func FuzzReadPack(f *testing.F) {
	hdr := func(files string) []byte {
		return []byte(`{"chunk_size":8192,"files":[` + files + `],"meta":{"id":"x"}}`)
	}
	page := bytes.Repeat([]byte{0xab}, 64)
	f.Add(hdr(`{"name":"vm.mem","size":20000}`), []byte{0, 0, 0, 0, 'W', 0, 1, 0, 2, 0, 0, 1}, page, uint8(0))
	f.Add(hdr(`{"name":"vm.mem","size":16384},{"name":"vm.state","size":9}`), []byte{1, 0, 0, 0, 3, 0, 1, 1, 2, 5, 9, 0, 1, 0, 9}, page, uint8(modeBase))
	// A base of two whole chunks: chunk 0 taken from it, chunk 1 a patch
	// of one page over the base's chunk 1.
	full := bytes.Repeat([]byte("base chunk bytes"), 2*fuzzChunk/16)
	f.Add(hdr(`{"name":"vm.mem","size":16384}`), []byte{1, 0, 0, 0, 3, 0, 1, 1, 1, 1, 0x77, 0x77}, full, uint8(modeBase))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{2, 0, 0, 2, 0, 1, 0xff}, page, uint8(0))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{0, 0, 0, 0, 0, 0, 0, 0}, page, uint8(0)) // a chunk sent twice
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{0, 0, 0, 0}, page, uint8(modeBadCRC))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{0, 0, 0, 0}, page, uint8(modeNoTrailer))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{1, 0, 0, 0}, page, uint8(0)) // a base the receiver does not hold
	f.Add(hdr(`{"name":"../escape","size":1}`), []byte{}, page, uint8(0))
	f.Add(hdr(`{"name":".hidden","size":1},{"name":"a/b","size":1}`), []byte{}, page, uint8(0))
	f.Add(hdr(`{"name":"vm.mem","size":-1}`), []byte{}, page, uint8(0))
	f.Add(hdr(`{"name":"vm.mem","size":9223372036854775807}`), []byte{0, 0, 0, 0}, page, uint8(0))
	f.Add([]byte(`{"chunk_size":4097,"files":[]}`), []byte{}, page, uint8(0))
	f.Add([]byte(`{"chunk_size":0,"files":[]}`), []byte{}, page, uint8(0))
	f.Add([]byte(`{"chunk_size":8192,"files":[{"name":"a","size":1},{"name":"a","size":1}]}`), []byte{}, page, uint8(0))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{4, 'E', 4, 0, 0, 0, 0}, page, uint8(modeNoTrailer))
	f.Add(hdr(`{"name":"vm.mem","size":8192}`), []byte{4, 'X', 1, 7}, page, uint8(0))
	f.Add([]byte("PSPK\x01\x00\x00\x00\x02\x00\x00\x00{}\x00\x00\x00\x00"), []byte{}, page, uint8(modeRaw))
	dir := f.TempDir()
	baseFile := filepath.Join(dir, "base", "vm.mem")
	recv := filepath.Join(dir, "recv")
	for _, d := range []string{filepath.Dir(baseFile), recv} {
		if err := os.Mkdir(d, 0o700); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, header, records, base []byte, mode uint8) {
		ctx := context.Background()
		if err := os.WriteFile(baseFile, base, 0o600); err != nil {
			t.Fatal(err)
		}
		clearDir(t, recv)

		// The receiver's base, in the chunk size the header names.
		var hv PackHeader
		json.Unmarshal(header, &hv)
		hcs := hv.ChunkSize
		if hcs <= 0 || hcs%pageSize != 0 || hcs > 1<<20 {
			hcs = fuzzChunk
		}
		idx, err := HashFile(ctx, baseFile, hcs)
		if err != nil {
			t.Fatal(err)
		}
		seeds := []Seed{SeedOf(baseFile, hcs, idx)}
		if mode&modeBase != 0 {
			var m map[string]any
			if json.Unmarshal(header, &m) == nil && m != nil {
				m["base"] = BaseDigest(map[string]Seed{"vm.mem": seeds[0]})
				header, _ = json.Marshal(m)
			}
		}
		stream, model := assemblePack(header, records, base, hcs, mode)

		br := bytes.NewReader(stream)
		r := bufio.NewReader(br)
		h, err := ReadPackHeader(r)
		var st PackStats
		if err == nil {
			if len(h.Files) > 0 && h.ChunkSize > 1<<20 {
				return // valid, but each run would hold megabytes: not what this target is for
			}
			st, err = ReadPack(ctx, r, h, recv, seeds)
		}
		if err != nil && !errors.Is(err, ErrPack) && !errors.Is(err, ErrPackBase) && !ioError(err) {
			t.Fatalf("pack refused with %v: want ErrPack, ErrPackBase or an I/O error", err)
		}

		// Nothing but the header's files in recv; the base as it was.
		got, err2 := os.ReadFile(baseFile)
		if err2 != nil || !bytes.Equal(got, base) {
			t.Fatalf("the receiver's base changed: %v", err2)
		}
		ents, err2 := os.ReadDir(dir)
		if err2 != nil || len(ents) != 2 {
			t.Fatalf("the directory above the receiving one holds %v (%v), want base and recv only", ents, err2)
		}
		ents, err2 = os.ReadDir(recv)
		if err2 != nil {
			t.Fatal(err2)
		}
		for _, e := range ents {
			if !slices.ContainsFunc(h.Files, func(f PackFile) bool { return f.Name == e.Name() }) || !e.Type().IsRegular() {
				t.Fatalf("the pack left %q (%v), which its header does not name", e.Name(), e.Type())
			}
		}
		if err != nil {
			return
		}
		if st.Chunks != st.ZeroChunks+st.BaseChunks+st.PatchChunks+st.WholeChunks || st.Bytes != int64(len(stream)-br.Len()-r.Buffered()) {
			t.Fatalf("stats %+v of a pack of %d bytes do not add up", st, len(stream))
		}
		for _, pf := range h.Files {
			fi, err := os.Stat(filepath.Join(recv, pf.Name))
			if err != nil || fi.Size() != pf.Size {
				t.Fatalf("%s: %v, size %d; want %d bytes", pf.Name, err, fi.Size(), pf.Size)
			}
			want, ok := model[pf.Name]
			if !ok || pf.Size > 1<<20 {
				continue // the model does not know it
			}
			b, err := os.ReadFile(filepath.Join(recv, pf.Name))
			if err != nil || !bytes.Equal(b, want) {
				t.Fatalf("%s: the pack's records make %q, the receiver wrote %q (%v)", pf.Name, want, b, err)
			}
		}

		// Round trip: a capture made of the base with the input's bytes
		// written over it, and a file of the header's bytes.
		roundTrip(t, dir, baseFile, seeds[0], hcs, records, header)
	})
}

// Modes of FuzzReadPack.
const (
	modeRaw       = 1 << 0 // header is the whole stream
	modeBase      = 1 << 1 // the header names the receiver's base digest
	modeBadCRC    = 1 << 2 // the first record's CRC is wrong
	modeNoTrailer = 1 << 3 // no trailer
)

// assemblePack frames header and the records that records describes into
// a pack stream (or returns header itself, modeRaw), and returns what the
// receiver's files should hold, by a model of the records: for each file
// of the header it can decode, its bytes, unless a record makes the
// outcome depend on what this host's file system does (absent then).
//
// records is a list of instructions, each starting with a byte op (mod
// 5): 0 a whole chunk (file, chunk, then the chunk's bytes, zero-padded);
// 1 a base record naming chunk k of the base (file, chunk, k); 2 a patch
// over zeros and 3 over base chunk k (file, chunk, k, n pages, then n page
// numbers, then the pages' bytes, zero-padded); 4 a raw record (type,
// file, chunk, length, bytes).
func assemblePack(header, records, base []byte, cs int64, mode uint8) ([]byte, map[string][]byte) {
	if mode&modeRaw != 0 {
		return header, nil
	}
	var out []byte
	out = append(out, packMagic...)
	out = binary.LittleEndian.AppendUint32(out, packVersion)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(header)))
	out = append(out, header...)
	out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))

	var h PackHeader
	model := map[string][]byte{}
	if json.Unmarshal(header, &h) != nil || h.ChunkSize != cs {
		model = nil
	} else {
		for _, f := range h.Files {
			if f.Size >= 0 && f.Size <= 1<<20 {
				model[f.Name] = make([]byte, f.Size)
			}
		}
	}
	baseChunk := func(k int) ([]byte, string) {
		n := (int64(len(base)) + cs - 1) / cs
		if n == 0 {
			return nil, hex.EncodeToString(make([]byte, 32))
		}
		i := int64(k) % n
		c := base[i*cs : min(int64(len(base)), (i+1)*cs)]
		sum := sha256.Sum256(c)
		return c, hex.EncodeToString(sum[:])
	}
	next := func(n int) []byte {
		b := make([]byte, n)
		k := copy(b, records)
		records = records[k:]
		return b
	}
	chunkOf := func(fi, ci int) []byte {
		if model == nil || fi >= len(h.Files) {
			return nil
		}
		b := model[h.Files[fi].Name]
		off := int64(ci) * cs
		if b == nil || off >= int64(len(b)) {
			return nil
		}
		return b[off:min(int64(len(b)), off+cs)]
	}
	unknown := func(fi int) {
		if model != nil && fi < len(h.Files) {
			delete(model, h.Files[fi].Name)
		}
	}
	count := 0
	for len(records) > 0 {
		op := next(1)[0] % 5
		var typ byte
		var payload []byte
		fi, ci := int(next(1)[0]), int(next(1)[0])
		c := chunkOf(fi, ci)
		switch op {
		case 0:
			typ = recWhole
			n := len(c)
			if c == nil {
				n = int(cs)
			}
			payload = next(n)
			copy(c, payload)
		case 1:
			typ = recBase
			bc, hash := baseChunk(int(next(1)[0]))
			payload, _ = hex.DecodeString(hash)
			if c != nil {
				if len(bc) != len(c) {
					unknown(fi) // a base chunk of another length: the file system decides
				} else {
					copy(c, bc)
				}
			}
		case 2, 3:
			typ = recPatch
			var bc []byte
			payload = make([]byte, 32)
			if op == 3 {
				var hash string
				bc, hash = baseChunk(int(next(1)[0]))
				payload, _ = hex.DecodeString(hash)
			}
			k := int(next(1)[0]) % 4
			pages := next(k)
			patch := append([]byte(nil), patchMagic...)
			patch = binary.LittleEndian.AppendUint32(patch, uint32(k))
			for _, p := range pages {
				patch = binary.LittleEndian.AppendUint32(patch, uint32(p%4))
			}
			if c != nil && op == 3 && len(bc) != len(c) {
				unknown(fi)
			} else if c != nil {
				clear(c)
				copy(c, bc)
			}
			// Over zeros, a zero page is the hole already there: not
			// written (what a repeated page number shows).
			overZeros := bc == nil
			for _, p := range pages {
				po := int(p%4) * pageSize
				n := pageSize
				if c != nil {
					n = max(0, min(pageSize, len(c)-po))
				}
				data := next(n)
				patch = append(patch, data...)
				if c != nil && po < len(c) && !(overZeros && isZero(data)) {
					copy(c[po:], data)
				}
			}
			payload = append(payload, patch...)
		default:
			typ = next(1)[0]
			payload = next(int(next(1)[0]))
			unknown(fi)
		}
		rec := []byte{typ, byte(fi)}
		rec = binary.LittleEndian.AppendUint32(rec, uint32(ci))
		rec = binary.LittleEndian.AppendUint32(rec, uint32(len(payload)))
		rec = append(rec, payload...)
		crc := crc32.Checksum(rec, castagnoli)
		if mode&modeBadCRC != 0 && count == 0 {
			crc++
		}
		out = append(out, rec...)
		out = binary.LittleEndian.AppendUint32(out, crc)
		if typ == recEnd {
			break
		}
		count++
	}
	if mode&modeNoTrailer == 0 {
		rec := []byte{recEnd, 0, 0, 0, 0, 0, 4, 0, 0, 0}
		rec = binary.LittleEndian.AppendUint32(rec, uint32(count))
		out = append(out, rec...)
		out = binary.LittleEndian.AppendUint32(out, crc32.Checksum(rec, castagnoli))
	}
	return out, model
}

// roundTrip packs a capture made from the base (the base with data's bytes
// written over it at the offsets data's first bytes name, and a file of
// other's bytes) against the base and reads it back.
func roundTrip(t *testing.T, dir, baseFile string, seed Seed, cs int64, data, other []byte) {
	ctx := context.Background()
	src := filepath.Join(dir, "src")
	dst := filepath.Join(dir, "dst")
	for _, d := range []string{src, dst} {
		os.RemoveAll(d)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	defer os.RemoveAll(src)
	defer os.RemoveAll(dst)
	capt, _ := os.ReadFile(baseFile)
	for len(data) >= 3 {
		off := int(binary.LittleEndian.Uint16(data)) % (len(capt) + 2*pageSize)
		if off >= len(capt) {
			capt = append(capt, make([]byte, off+1-len(capt))...)
		}
		capt[off] = data[2]
		data = data[3:]
	}
	files := map[string]string{"vm.mem": filepath.Join(src, "vm.mem"), "vm.state": filepath.Join(src, "vm.state")}
	for name, b := range map[string][]byte{"vm.mem": capt, "vm.state": other} {
		if err := os.WriteFile(files[name], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var pack bytes.Buffer
	wst, err := WritePack(ctx, &pack, files, PackOptions{ChunkSize: cs, Meta: json.RawMessage(`{"id":"x"}`), Bases: map[string]Seed{"vm.mem": seed}})
	if err != nil {
		t.Fatalf("WritePack: %v", err)
	}
	r := bufio.NewReader(&pack)
	h, err := ReadPackHeader(r)
	if err != nil {
		t.Fatalf("ReadPackHeader of WritePack's pack: %v", err)
	}
	rst, err := ReadPack(ctx, r, h, dst, []Seed{seed})
	if err != nil {
		t.Fatalf("ReadPack of WritePack's pack: %v", err)
	}
	for name, want := range map[string][]byte{"vm.mem": capt, "vm.state": other} {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: received %d bytes (%v), not the %d sent", name, len(got), err, len(want))
		}
	}
	// What only one side counts, and times.
	wst.Dur, rst.Dur, wst.SetupDur, wst.Unread, wst.BytesRead, rst.Reflinked = 0, 0, 0, 0, 0, 0
	if !reflect.DeepEqual(wst, rst) {
		t.Fatalf("sent %+v, received %+v", wst, rst)
	}
}

// clearDir removes what dir holds.
func clearDir(t *testing.T, dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

// ioError reports whether err is this host's I/O failing (a file too
// large for the file system, ...), not the pack's fault as such.
func ioError(err error) bool {
	var pe *fs.PathError
	var errno syscall.Errno
	return errors.As(err, &pe) || errors.As(err, &errno)
}

// FuzzManifest decodes arbitrary manifests as Store.Manifest does (they
// come from the object store, which every host writes) and checks that an
// accepted one is safe to download: file names are single path
// components, each file has as many chunks as its size needs, hashes are
// hashes, deltas name chunks of the file, and the chunk size is one a
// download can hold in memory (New's bound). An accepted manifest
// re-encodes to one that decodes to the same.
func FuzzManifest(f *testing.F) {
	h := "a3f1c09b7e5d4c2f8e6b1a0d9c7e5f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e"
	h2 := "0000000000000000000000000000000000000000000000000000000000000001"
	for _, s := range []string{
		`{"version":1,"name":"templates/base","chunk_size":2097152,"files":[{"name":"vm.mem","size":4194304,"chunks":["` + h + `",""]}]}`,
		`{"version":2,"name":"snapshots/x","chunk_size":4096,"files":[{"name":"vm.mem","size":8192,"chunks":["` + h + `","` + h2 + `"],"deltas":{"1":{"base":"` + h + `","patch":"` + h2 + `"}}}],"meta":{"id":"x"}}`,
		`{"version":2,"chunk_size":4096,"files":[{"name":"a","size":1,"chunks":["` + h + `"],"deltas":{"0":{"patch":"` + h2 + `"}}}]}`,
		`{"version":1,"chunk_size":1099511627776,"files":[{"name":"vm.mem","size":1,"chunks":["` + h + `"]}]}`,
		`{"version":1,"chunk_size":4096,"files":[{"name":"../x","size":0,"chunks":[]}]}`,
		`{"version":1,"chunk_size":4096,"files":[{"name":"a","size":-4096,"chunks":[]}]}`,
		`{"version":1,"chunk_size":4096,"files":[{"name":"a","size":4097,"chunks":["",""]}]}`,
		`{"version":2,"chunk_size":4096,"files":[{"name":"a","size":4096,"chunks":[""],"deltas":{"0":{"patch":"` + h + `"}}}]}`,
		`{"version":1,"chunk_size":4096,"files":[{"name":"a","size":4096,"chunks":["` + h + `"],"deltas":{"0":{"patch":"` + h2 + `"}}}]}`,
		`{"version":2,"chunk_size":4096,"files":[{"name":"a","size":4096,"chunks":["` + h + `"],"deltas":{"-1":{"patch":"` + h2 + `"}}}]}`,
		`{"version":1,"chunk_size":4096,"files":[{"name":"a","size":9223372036854775807,"chunks":[]}]}`,
		`{"version":1,"chunk_size":-1,"files":[]}`,
		`{"version":3}`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Manifest
		if json.Unmarshal(b, &m) != nil || m.check() != nil {
			return
		}
		if m.ChunkSize <= 0 || m.ChunkSize > maxChunkSize {
			t.Fatalf("manifest %s accepted with chunk size %d: a download would allocate that per worker", b, m.ChunkSize)
		}
		for _, f := range m.Files {
			if validFileName(f.Name) != nil || filepath.Base(f.Name) != f.Name {
				t.Fatalf("manifest %s accepted with file name %q", b, f.Name)
			}
			if f.Size < 0 || int64(len(f.Chunks)) != (f.Size+m.ChunkSize-1)/m.ChunkSize {
				t.Fatalf("manifest %s accepted: file %q of %d bytes in %d chunks", b, f.Name, f.Size, len(f.Chunks))
			}
			for i := range f.Deltas {
				if i < 0 || i >= len(f.Chunks) {
					t.Fatalf("manifest %s accepted: a delta of chunk %d of %d", b, i, len(f.Chunks))
				}
			}
		}
		var objs []string
		m.Objects(func(h string) { objs = append(objs, h) })
		for _, h := range objs {
			if !validHash(h) || objstore.ValidKey(chunkKey(h)) != nil {
				t.Fatalf("manifest %s accepted: object %q", b, h)
			}
		}
		re, err := json.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		var again Manifest
		if err := json.Unmarshal(re, &again); err != nil || again.check() != nil || !reflect.DeepEqual(normalManifest(again), normalManifest(m)) {
			t.Fatalf("manifest %s re-encoded as %s does not read back the same", b, re)
		}
	})
}

// normalManifest makes equal manifests DeepEqual: empty and nil maps and
// slices alike, Meta compacted.
func normalManifest(m Manifest) Manifest {
	var files []File
	for _, f := range m.Files {
		if len(f.Deltas) == 0 {
			f.Deltas = nil
		}
		if len(f.Chunks) == 0 {
			f.Chunks = nil
		}
		files = append(files, f)
	}
	m.Files = files
	if len(m.Meta) > 0 {
		var b bytes.Buffer
		if json.Compact(&b, m.Meta) == nil {
			m.Meta = b.Bytes()
		}
	}
	return m
}
