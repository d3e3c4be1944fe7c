package hostwire

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A pack ticket grants GET /snapshots/{id}/pack of one snapshot, until it
// expires, to a host agent that does not hold the agent's token: the
// control plane gives one to the host a cross-host fork's child goes to,
// which then fetches the pack straight from the agent
// (`Authorization: Ticket <ticket>`). It is
// "v1.<snapshot id>.<expiry, Unix seconds>.<HMAC-SHA256 in hex>", keyed
// with the SHA-256 of the agent's token (which the agent keeps, not the
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
func ticketMAC(key [sha256.Size]byte, snapshotID string, exp int64) []byte {
	m := hmac.New(sha256.New, key[:])
	fmt.Fprintf(m, "panda pack ticket\x00%s\x00%d", snapshotID, exp)
	return m.Sum(nil)
}

// TicketGrants reports whether ticket t, checked with key (the SHA-256
// of the agent's token), grants snapshotID's pack at now.
func TicketGrants(key [sha256.Size]byte, t, snapshotID string, now time.Time) bool {
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
