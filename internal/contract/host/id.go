package host

import "crypto/rand"

// NewID returns a fresh sandbox or snapshot id: 20 lowercase letters and
// digits.
func NewID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// ValidID reports whether id has the form of a sandbox or snapshot id: 1 to
// 64 lowercase letters and digits (no dashes: E2B's SDKs and routes accept
// no others).
func ValidID(id string) bool {
	if len(id) < 1 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
