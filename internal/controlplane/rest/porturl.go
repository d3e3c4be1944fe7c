package rest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
)

// Signed port URLs. A token names one port of one sandbox until a time,
// signed by the server's URL secret (Config.URLSecret):
//
//	base64url, unpadded, of
//	  version   1 byte   (1)
//	  expires   8 bytes  Unix seconds, big-endian
//	  port      2 bytes  big-endian
//	  id length 1 byte
//	  id        the sandbox id
//	  mac       16 bytes HMAC-SHA256(secret, "pandastack port url\x00" || all of the above), truncated
//
// 64 characters for a 20-character id. A token proves nothing but what it
// names: whoever holds it reaches that port until it expires (the sandbox
// must still be running). There is no revocation list: changing the secret
// (deleting its file and restarting) voids every token.

const (
	tokenVersion = 1
	tokenMACLen  = 16
	tokenHead    = 1 + 8 + 2 + 1 // version, expires, port, id length
	// maxTokenLen bounds what is decoded: a 64-byte id makes the longest.
	maxTokenLen = 128
)

var tokenLabel = []byte("pandastack port url\x00")

// portToken is what a signed URL grants.
type portToken struct {
	SandboxID string
	Port      int
	Expires   time.Time // whole seconds
}

func tokenMAC(secret, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(tokenLabel)
	m.Write(body)
	return m.Sum(nil)[:tokenMACLen]
}

// sign encodes t signed with secret. t's id must be valid (host.ValidID)
// and its port 1-65535.
func (t portToken) sign(secret []byte) string {
	b := make([]byte, 0, tokenHead+len(t.SandboxID)+tokenMACLen)
	b = append(b, tokenVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(t.Expires.Unix()))
	b = binary.BigEndian.AppendUint16(b, uint16(t.Port))
	b = append(b, byte(len(t.SandboxID)))
	b = append(b, t.SandboxID...)
	b = append(b, tokenMAC(secret, b)...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// errTokenInvalid: a token this server did not sign (forged, altered,
// truncated, signed with another secret).
var errTokenInvalid = errorf(controlplane.Forbidden,
	"invalid signed URL: it was not made by this server or it was altered; ask for a new one (POST /v1/sandboxes/{id}/ports/{port}/url)")

// parseToken verifies s against secret and returns what it grants, or a
// 403 error: errTokenInvalid, or one that says when it expired.
func parseToken(secret []byte, s string, now time.Time) (portToken, error) {
	if len(s) > maxTokenLen || strings.IndexFunc(s, notBase64URL) >= 0 {
		// base64's decoder skips CR and LF: a token with them inserted
		// would verify, and carry them into a cookie.
		return portToken{}, errTokenInvalid
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < tokenHead+1+tokenMACLen || b[0] != tokenVersion {
		return portToken{}, errTokenInvalid
	}
	body, mac := b[:len(b)-tokenMACLen], b[len(b)-tokenMACLen:]
	if !hmac.Equal(mac, tokenMAC(secret, body)) {
		return portToken{}, errTokenInvalid
	}
	exp := int64(binary.BigEndian.Uint64(body[1:9]))
	port := int(binary.BigEndian.Uint16(body[9:11]))
	n := int(body[11])
	id := string(body[tokenHead:])
	if len(id) != n || !host.ValidID(id) || port == 0 {
		return portToken{}, errTokenInvalid // signed by us, so a bug: still refused
	}
	t := portToken{SandboxID: id, Port: port, Expires: time.Unix(exp, 0).UTC()}
	if !now.Before(t.Expires) {
		return portToken{}, errorf(controlplane.Forbidden,
			"this signed URL for port %d of sandbox %s expired at %s; ask for a new one", port, id, t.Expires.Format(time.RFC3339))
	}
	return t, nil
}

// notBase64URL reports whether c is outside the unpadded base64url
// alphabet of tokens.
func notBase64URL(c rune) bool {
	return !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_')
}

// URLSecretFile is the usual name of the URL secret's file in a data
// directory (LoadOrCreateURLSecret).
const URLSecretFile = "url.secret"

// LoadOrCreateURLSecret reads the secret that signs port URLs from path
// (its text, surrounding white space ignored, is the HMAC key), or, if
// there is no file, writes a new random one there (32 bytes, in hex, mode
// 0600). Every server that must accept the same URLs needs the same file;
// replacing it voids every URL signed before.
func LoadOrCreateURLSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		sec := strings.TrimSpace(string(b))
		if len(sec) < 16 {
			return nil, fmt.Errorf("read url secret: %s holds %d characters, want at least 16", path, len(sec))
		}
		return []byte(sec), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read url secret: %w", err)
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	sec := hex.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return LoadOrCreateURLSecret(path) // made meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("write url secret: %w", err)
	}
	if _, err := f.WriteString(sec + "\n"); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("write url secret: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("write url secret: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("write url secret: %w", err)
	}
	return []byte(sec), nil
}

// Signed tokens are credentials: whoever reads one in a log reaches its
// port. The server's logger (Config.Logger, wrapped by New) therefore
// never writes one: in every message and attribute, a /p/{token} path
// segment, a panda_token=… parameter and an API key become [redacted].
// (Request paths are logged with failures: a 5xx of the port proxy, a
// panic, the router's.)

// secretInText matches what redactSecrets hides: the token of a signed
// path (the router's {token} segment: up to the next slash), a
// panda_token parameter's value, an API key.
var secretInText = regexp.MustCompile(`(/p/)[^/?#\s"]+|(` + tokenParam + `=)[^&\s"]+|` + apiKeyPrefix + `[a-z0-9]{16,}`)

// redactSecrets returns s without signed tokens and API keys.
func redactSecrets(s string) string {
	if !strings.Contains(s, "/p/") && !strings.Contains(s, tokenParam) && !strings.Contains(s, apiKeyPrefix) {
		return s
	}
	return secretInText.ReplaceAllStringFunc(s, func(m string) string {
		switch {
		case strings.HasPrefix(m, "/p/"):
			return "/p/[redacted]"
		case strings.HasPrefix(m, tokenParam+"="):
			return tokenParam + "=[redacted]"
		}
		return apiKeyPrefix + "[redacted]"
	})
}

// redactingHandler is a slog.Handler that passes records on with
// redactSecrets applied to the message and to every string, error and
// Stringer value, in groups too.
type redactingHandler struct{ next slog.Handler }

// RedactingLogger wraps l so that it never logs a signed token or a key.
func RedactingLogger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(redactingHandler); ok {
		return l
	}
	return slog.New(redactingHandler{l.Handler()})
}

func (h redactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, redactSecrets(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h redactingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = redactAttr(a)
	}
	return redactingHandler{h.next.WithAttrs(red)}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h.next.WithGroup(name)}
}

func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, redactSecrets(v.String()))
	case slog.KindGroup:
		g := v.Group()
		red := make([]any, len(g))
		for i, ga := range g {
			red[i] = redactAttr(ga)
		}
		return slog.Group(a.Key, red...)
	case slog.KindAny:
		var text string
		switch x := v.Any().(type) {
		case error:
			text = x.Error()
		case fmt.Stringer:
			text = x.String()
		default:
			return slog.Attr{Key: a.Key, Value: v}
		}
		if r := redactSecrets(text); r != text {
			return slog.String(a.Key, r)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
