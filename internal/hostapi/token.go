package hostapi

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ReadToken reads an agent token from path (surrounding white space is
// ignored).
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read agent token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("read agent token: %s is empty", path)
	}
	return tok, nil
}

// LoadOrCreateToken reads the agent token at path, or, if there is no
// file, writes a new random one there (mode 0600). created reports the
// latter.
func LoadOrCreateToken(path string) (token string, created bool, err error) {
	tok, err := ReadToken(path)
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
