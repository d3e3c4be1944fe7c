package guestprototest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// PatternReader returns a reader of size deterministic pseudo-random bytes
// derived from seed, generated as they are read (nothing is held in memory).
func PatternReader(seed uint64, size int64) io.Reader {
	var key [32]byte
	for i := range 4 {
		key[i*8] = byte(seed >> (8 * i))
	}
	return io.LimitReader(rand.NewChaCha8(key), size)
}

// VerifyFileRoundTrip uploads size pattern bytes to path with WriteFile,
// downloads them with ReadFile, and checks that size and SHA-256 match, with
// both transfers streamed. It returns the hex SHA-256. The VM integration test
// runs it with 1 GiB.
func VerifyFileRoundTrip(ctx context.Context, c *guestproto.Client, path string, size int64) (string, error) {
	up := sha256.New()
	n, err := c.WriteFile(ctx, path, io.TeeReader(PatternReader(uint64(size), size), up), 0o644)
	if err != nil {
		return "", fmt.Errorf("round trip %s: %w", path, err)
	}
	if n != size {
		return "", fmt.Errorf("round trip %s: stored %d bytes, want %d", path, n, size)
	}
	rc, info, err := c.ReadFile(ctx, path)
	if err != nil {
		return "", fmt.Errorf("round trip %s: %w", path, err)
	}
	defer rc.Close()
	if info.Size != size {
		return "", fmt.Errorf("round trip %s: stat size %d, want %d", path, info.Size, size)
	}
	down := sha256.New()
	got, err := io.Copy(down, rc)
	if err != nil {
		return "", fmt.Errorf("round trip %s: download: %w", path, err)
	}
	if got != size {
		return "", fmt.Errorf("round trip %s: downloaded %d bytes, want %d", path, got, size)
	}
	sum := hex.EncodeToString(up.Sum(nil))
	if d := hex.EncodeToString(down.Sum(nil)); d != sum {
		return "", fmt.Errorf("round trip %s: downloaded sha256 %s, uploaded %s", path, d, sum)
	}
	return sum, nil
}
