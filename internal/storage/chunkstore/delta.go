package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// Deltas. A chunk that differs from a chunk the store holds already (its
// Base: in practice the chunk at the same offset of the template a
// capture was made from, or zeros) in a few 4 KiB pages is stored as a
// patch of those pages rather than whole: guest memory and disk images of
// sandboxes differ from their template's in scattered pages, which would
// otherwise cost a whole chunk each. A patch is an object under chunks/
// named by the hash of its own bytes:
//
//	"PDP1" | uint32 k | k × uint32 page index (ascending) | the k pages
//
// (little endian; a page is 4096 bytes, the last one of a short chunk
// shorter). The manifest keeps the chunk's own hash in File.Chunks and
// says how to make it in File.Deltas; a reader makes the base (from a
// local seed, the store or zeros), lays the pages over it and checks the
// result against the chunk's hash. A manifest with deltas is version 2:
// code that cannot read them refuses it instead of failing on a missing
// chunk.

// Delta says how chunk i of a File is made: its Base chunk (a hash; ""
// for zeros) with the pages of the Patch object laid over it.
type Delta struct {
	Base  string `json:"base,omitempty"`
	Patch string `json:"patch"`
}

var patchMagic = []byte("PDP1")

// makePatch returns the patch that turns base into chunk (both of the
// same length), or nil if it would not be smaller than half the chunk.
func makePatch(chunk, base []byte) []byte {
	var pages []uint32
	for off := 0; off < len(chunk); off += pageSize {
		end := min(off+pageSize, len(chunk))
		if !bytes.Equal(chunk[off:end], base[off:end]) {
			pages = append(pages, uint32(off/pageSize))
		}
	}
	size := 8 + 4*len(pages) + len(pages)*pageSize
	if len(pages) == 0 || size >= len(chunk)/2 {
		return nil
	}
	out := make([]byte, 0, size)
	out = append(out, patchMagic...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(pages)))
	for _, p := range pages {
		out = binary.LittleEndian.AppendUint32(out, p)
	}
	for _, p := range pages {
		off := int(p) * pageSize
		out = append(out, chunk[off:min(off+pageSize, len(chunk))]...)
	}
	return out
}

// applyPatch lays the pages of patch over buf (holding the base).
func applyPatch(buf, patch []byte) error {
	if len(patch) < 8 || !bytes.Equal(patch[:4], patchMagic) {
		return errors.New("not a patch")
	}
	k := int(binary.LittleEndian.Uint32(patch[4:8]))
	if k > (len(buf)+pageSize-1)/pageSize || len(patch) < 8+4*k {
		return fmt.Errorf("patch of %d pages for a chunk of %d bytes", k, len(buf))
	}
	data := patch[8+4*k:]
	for j := range k {
		p := int(binary.LittleEndian.Uint32(patch[8+4*j:]))
		off := p * pageSize
		if off >= len(buf) {
			return fmt.Errorf("patch page %d beyond a chunk of %d bytes", p, len(buf))
		}
		n := min(pageSize, len(buf)-off)
		if len(data) < n {
			return errors.New("patch is short")
		}
		copy(buf[off:off+n], data[:n])
		data = data[n:]
	}
	if len(data) != 0 {
		return errors.New("patch is long")
	}
	return nil
}

// fetchObject reads chunks/hash (a patch: at most max bytes) and checks its
// hash.
func (s *Store) fetchObject(ctx context.Context, hash string, max int64) ([]byte, error) {
	rc, err := s.objs.Get(ctx, chunkKey(hash))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", hash, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", hash, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("chunk %s: longer than %d bytes", hash, max)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hash {
		return nil, fmt.Errorf("chunk %s: content does not match its hash", hash)
	}
	return b, nil
}

// maxPatch bounds a patch of a chunk of n bytes.
func maxPatch(n int64) int64 { return 8 + 4*(n/pageSize+1) + n }

// build makes chunk hash (len(buf) bytes) from delta d into buf: its base
// from a seed (ss, if it holds it; nil: none), zeros or the store, then
// the patch from the store; and checks the result. It returns the bytes
// read from the store.
func (s *Store) build(ctx context.Context, ss *seedSet, hash string, d Delta, buf []byte) (fetched int64, err error) {
	n := int64(len(buf))
	have, trusted := false, false
	if d.Base == "" {
		clear(buf)
		have = true
	} else if ss != nil {
		have, trusted = ss.read(d.Base, buf)
	}
	if !have {
		if err := s.fetch(ctx, d.Base, buf); err != nil {
			return 0, fmt.Errorf("base of %s: %w", hash, err)
		}
		fetched += n
	}
	patch, err := s.fetchObject(ctx, d.Patch, maxPatch(n))
	if err != nil {
		return fetched, err
	}
	fetched += int64(len(patch))
	if err := applyPatch(buf, patch); err != nil {
		return fetched, fmt.Errorf("chunk %s: patch %s: %w", hash, d.Patch, err)
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != hash {
		if trusted {
			// A base taken unhashed from a seed proven current was not
			// what its index says after all: make it from the store's.
			f, err := s.build(ctx, nil, hash, d, buf)
			return fetched + f, err
		}
		return fetched, fmt.Errorf("chunk %s: made from its base and patch, it does not match its hash", hash)
	}
	return fetched, nil
}
