package rest

import (
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane"
)

func TestPortToken(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	now := time.Unix(1_800_000_000, 0)
	tok := portToken{SandboxID: "roaky6v3gf9wgdz9cs39", Port: 8000, Expires: now.Add(time.Hour)}
	s := tok.sign(secret)
	if len(s) != 64 || strings.ContainsAny(s, "+/=") {
		t.Errorf("token %q: want 64 base64url characters", s)
	}
	got, err := parseToken(secret, s, now)
	if err != nil || got.SandboxID != tok.SandboxID || got.Port != tok.Port || !got.Expires.Equal(tok.Expires) {
		t.Fatalf("parse: got %+v, %v; want %+v", got, err, tok)
	}
	isForbidden := func(err error, text string) bool {
		ae, ok := err.(*controlplane.Error)
		return ok && statusOf(ae.Kind) == http.StatusForbidden && strings.Contains(ae.Msg, text)
	}
	if _, err := parseToken(secret, s, tok.Expires); !isForbidden(err, "expired") {
		t.Errorf("at its expiry: got %v, want 403 expired", err)
	}
	if _, err := parseToken([]byte("another secret, just as long!!!!"), s, now); !isForbidden(err, "invalid signed URL") {
		t.Errorf("another secret: got %v, want 403 invalid", err)
	}
	// Every bit of the token counts.
	raw, _ := base64.RawURLEncoding.DecodeString(s)
	for i := range raw {
		bad := append([]byte(nil), raw...)
		bad[i] ^= 0x01
		if _, err := parseToken(secret, base64.RawURLEncoding.EncodeToString(bad), now); !isForbidden(err, "invalid signed URL") {
			t.Errorf("bit 0 of byte %d flipped: got %v, want 403 invalid", i, err)
		}
	}
	for _, bad := range []string{"", "!!!", s[:len(s)-1], s + "A", strings.Repeat("A", 64), strings.Repeat("A", 1000),
		s[:10] + "\r\n" + s[10:], s[:10] + "\n" + s[10:], s + "="} {
		if _, err := parseToken(secret, bad, now); !isForbidden(err, "invalid signed URL") {
			t.Errorf("token %q: got %v, want 403 invalid", bad, err)
		}
	}
}

func TestLoadOrCreateURLSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), URLSecretFile)
	a, err := LoadOrCreateURLSecret(path)
	if err != nil || len(a) != 64 {
		t.Fatalf("create: got %d bytes, %v; want 64 (hex of 32)", len(a), err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	b, err := LoadOrCreateURLSecret(path)
	if err != nil || string(a) != string(b) {
		t.Errorf("read again: got %q, %v; want %q", b, err, a)
	}
	os.WriteFile(path, []byte("short\n"), 0o600)
	if _, err := LoadOrCreateURLSecret(path); err == nil {
		t.Error("a 5-character secret was accepted")
	}
}

func TestParseProcNetTCP(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
   2: 0100007F:2328 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0000000000000000 20 4 30 10 -1
   3: garbage
   4: 0100007F:0000 00000000:0000 0A
   5: 0F02000A:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0000000000000000 100 0 0 10 0
`
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F41 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 7 1 0000000000000000 100 0 0 10 0
`
	var all []portJSON
	for _, f := range []string{tcp, tcp6, tcp} { // twice: repeats are dropped
		ps, err := parseProcNetTCP(strings.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ps...)
	}
	got := dedupPorts(all)
	want := []portJSON{{22, "::1"}, {80, "10.0.2.15"}, {8000, "0.0.0.0"}, {8000, "::"}, {8001, "::ffff:127.0.0.1"}, {9000, "127.0.0.1"}}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, err := parseProcNetTCP(strings.NewReader("header\n" + strings.Repeat("x", 70<<10) + "\n")); err == nil {
		t.Error("a 70 KiB line was accepted")
	}
}

func TestProxyHostAndParams(t *testing.T) {
	s := &Server{cfg: Config{ProxyDomain: "sbx.example.dev"}}
	for _, tc := range []struct {
		host string
		id   string
		port int
		ok   bool
	}{
		{"8000-abc123.sbx.example.dev", "abc123", 8000, true},
		{"8000-ABC123.SBX.example.dev:443", "abc123", 8000, true},
		{"8000-abc123.sbx.example.dev.", "abc123", 8000, true},
		{"sbx.example.dev", "", 0, false},
		{"x.8000-abc123.sbx.example.dev", "", 0, false},
		{"8000abc.sbx.example.dev", "", 0, false},
		{"0-abc.sbx.example.dev", "", 0, false},
		{"65536-abc.sbx.example.dev", "", 0, false},
		{"8000-abc.other.dev", "", 0, false},
		{"8000-abc.xsbx.example.dev", "", 0, false},
	} {
		id, port, ok := s.proxyHost(tc.host)
		if id != tc.id || port != tc.port || ok != tc.ok {
			t.Errorf("proxyHost(%q) = %q, %d, %v; want %q, %d, %v", tc.host, id, port, ok, tc.id, tc.port, tc.ok)
		}
	}
	for _, d := range []string{"example.dev", "a-b.example.dev", "localhost"} {
		if !validProxyDomain(d) {
			t.Errorf("%q refused", d)
		}
	}
	for _, d := range []string{"", "dev", "Example.dev", "-a.dev", "a..dev", "a_b.dev", "*.example.dev"} {
		if validProxyDomain(d) {
			t.Errorf("%q accepted", d)
		}
	}
	q, vals := withoutParam("a=1&panda_token=T1&b=%20&panda%5Ftoken=T2", "panda_token")
	if q != "a=1&b=%20" || len(vals) != 2 || vals[0] != "T1" || vals[1] != "T2" {
		t.Errorf("withoutParam: got %q %q", q, vals)
	}
	h := http.Header{"Cookie": {"a=1; panda_token=x", "panda_token=y; b=2"}}
	dropCookie(h, "panda_token")
	if got := h.Values("Cookie"); len(got) != 1 || got[0] != "a=1; b=2" {
		t.Errorf("dropCookie: got %q", got)
	}
	h = http.Header{"Cookie": {"panda_token=x"}}
	dropCookie(h, "panda_token")
	if _, ok := h["Cookie"]; ok {
		t.Errorf("dropCookie left %q", h.Values("Cookie"))
	}
}
