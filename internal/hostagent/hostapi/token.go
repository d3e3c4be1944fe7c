package hostapi

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// LoadOrCreateToken reads the agent token at path, or, if there is no
// file, writes a new random one there (mode 0600). created reports the
// latter.
func LoadOrCreateToken(path string) (token string, created bool, err error) {
	tok, err := hostwire.ReadToken(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return tok, false, err
	}
	b := make([]byte, 32)
	rand.Read(b)
	tok = "pandaagent_" + hex.EncodeToString(b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", false, fmt.Errorf("write agent token: %w", err)
	}
	if _, err := f.WriteString(tok + "\n"); err != nil {
		f.Close()
		os.Remove(path)
		return "", false, fmt.Errorf("write agent token: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return "", false, fmt.Errorf("write agent token: %w", err)
	}
	return tok, true, nil
}
