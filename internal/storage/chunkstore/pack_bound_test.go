package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// TestReadPackLargestRecord: a record whose payload has the largest size
// a pack may hold (a base hash and the longest patch of a chunk) is read
// and judged, not a panic. The payload buffer lacked room for the CRC
// after it, so such a record (which any sender can write) crashed the
// receiving host with a slice out of range (found by FuzzReadPack).
func TestReadPackLargestRecord(t *testing.T) {
	t.Parallel() // a store of its own
	const chunk = 8192
	hdr := []byte(`{"chunk_size":8192,"files":[{"name":"vm.mem","size":8192}]}`)
	var b bytes.Buffer
	b.Write(packMagic)
	b.Write(binary.LittleEndian.AppendUint32(nil, packVersion))
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(hdr))))
	b.Write(hdr)
	b.Write(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(b.Bytes(), castagnoli)))
	payload := make([]byte, sha256.Size+maxPatch(chunk))
	rec := []byte{recPatch, 0, 0, 0, 0, 0}
	rec = binary.LittleEndian.AppendUint32(rec, uint32(len(payload)))
	rec = append(rec, payload...)
	b.Write(rec)
	b.Write(binary.LittleEndian.AppendUint32(nil, crc32.Checksum(rec, castagnoli)))

	r := bufio.NewReader(&b)
	h, err := ReadPackHeader(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPack(context.Background(), r, h, t.TempDir(), nil); !errors.Is(err, ErrPack) {
		t.Fatalf("a record of %d bytes of zeros (not a patch): %v, want ErrPack", len(payload), err)
	}
}
