package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
)

// ChunkSize is the chunk size of s's uploads.
func (s *Store) ChunkSize() int64 { return s.cfg.ChunkSize }

// HashFile returns the chunk hashes of the local file path, as an upload
// of it with chunks of chunkSize would list them ("" for a chunk of
// zeros), without a store: an index of the file that makes it a Seed.
// Holes are not read.
func HashFile(ctx context.Context, path string, chunkSize int64) (File, error) {
	f, err := os.Open(path)
	if err != nil {
		return File{}, fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return File{}, fmt.Errorf("hash %s: %w", path, err)
	}
	out := File{Size: fi.Size(), Chunks: make([]string, (fi.Size()+chunkSize-1)/chunkSize)}
	buf := make([]byte, chunkSize)
	for i := range out.Chunks {
		if err := ctx.Err(); err != nil {
			return File{}, err
		}
		off, n := int64(i)*chunkSize, chunkLen(fi.Size(), chunkSize, i)
		hole, err := inHole(f, off, n)
		if err != nil {
			return File{}, fmt.Errorf("hash %s: %w", path, err)
		}
		if hole {
			continue
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return File{}, fmt.Errorf("hash %s: %w", path, err)
		}
		if bytes.Equal(buf[:n], zeros[:n]) {
			continue
		}
		sum := sha256.Sum256(buf[:n])
		out.Chunks[i] = hex.EncodeToString(sum[:])
	}
	return out, nil
}
