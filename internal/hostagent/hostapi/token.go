package hostapi

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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

// A pack ticket grants GET /snapshots/{id}/pack of one snapshot, until it
// expires, to a host agent that does not hold this agent's token: the
// control plane gives one to the host a cross-host fork's child goes to,
// which then fetches the pack straight from this agent. It is
// "v1.<snapshot id>.<expiry, Unix seconds>.<HMAC-SHA256 in hex>", keyed
// with the SHA-256 of this agent's token (which the agent keeps, not the
// token itself).
const ticketPrefix = "v1."

// PackTicket is a ticket for snapshot snapshotID's pack of the agent whose
// token is token, valid until expires.
func PackTicket(token, snapshotID string, expires time.Time) string {
	key := sha256.Sum256([]byte(token))
	exp := expires.Unix()
	return fmt.Sprintf("%s%s.%d.%x", ticketPrefix, snapshotID, exp, ticketMAC(key, snapshotID, exp))
}

// ticketMAC is the MAC of a ticket for snapshotID expiring at exp.
func ticketMAC(key [32]byte, snapshotID string, exp int64) []byte {
	m := hmac.New(sha256.New, key[:])
	fmt.Fprintf(m, "panda pack ticket\x00%s\x00%d", snapshotID, exp)
	return m.Sum(nil)
}

// ticketGrants reports whether ticket t, checked with key (the SHA-256
// of the agent's token), grants snapshotID's pack at now.
func ticketGrants(key [32]byte, t, snapshotID string, now time.Time) bool {
	rest, ok := strings.CutPrefix(t, ticketPrefix)
	if !ok {
		return false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || parts[0] != snapshotID {
		return false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || now.Unix() >= exp {
		return false
	}
	mac, err := hex.DecodeString(parts[2])
	return err == nil && hmac.Equal(mac, ticketMAC(key, snapshotID, exp))
}
