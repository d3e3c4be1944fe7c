package restfuzz

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/prometheus/client_golang/prometheus"
)

// signToken makes a signed port token as api/porturl.go documents its
// wire format (version 1, expiry, port, id, truncated HMAC-SHA256 of
// "pandastack port url\x00" and the rest, unpadded base64url): the format
// of every signed URL handed out, which must keep working.
func signToken(secret []byte, id string, port uint16, exp int64) string {
	b := []byte{1}
	b = binary.BigEndian.AppendUint64(b, uint64(exp))
	b = binary.BigEndian.AppendUint16(b, port)
	b = append(b, byte(len(id)))
	b = append(b, id...)
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pandastack port url\x00"))
	m.Write(b)
	return base64.RawURLEncoding.EncodeToString(append(b, m.Sum(nil)[:16]...))
}

// grant is what a token the documented format accepts grants: false if
// its MAC is not the secret's (or it is malformed).
func grant(secret []byte, tok string) (id string, port int, exp int64, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 12+1+16 || b[0] != 1 {
		return "", 0, 0, false
	}
	body, mac := b[:len(b)-16], b[len(b)-16:]
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("pandastack port url\x00"))
	m.Write(body)
	if !hmac.Equal(mac, m.Sum(nil)[:16]) {
		return "", 0, 0, false
	}
	exp = int64(binary.BigEndian.Uint64(body[1:9]))
	port = int(binary.BigEndian.Uint16(body[9:11]))
	id = string(body[12:])
	return id, port, exp, int(body[11]) == len(id)
}

// Modes of FuzzPortToken.
const (
	ptSigned = 1 << iota // a token signed as documented, then altered by flip
	ptDomain             // presented on the proxy domain (?panda_token=), else as /p/{token}/
	ptCookie             // on the proxy domain, as the panda_token cookie
	ptOther              // signed with another secret
)

// FuzzPortToken presents signed port tokens (the credential of signed
// URLs, /p/{token}/… and the proxy domain's panda_token) to the server:
// tokens it makes as the documented wire format says, for any sandbox id,
// port and expiry, then altered at the bytes flip names (or signed with
// another secret), and arbitrary strings. It checks that a token reaches
// a guest exactly when the documented format says it grants that: a MAC
// of this server's secret over its contents, an unexpired time, a port
// from 1 to 65535, a valid id of a running sandbox, and then only that
// sandbox and port; so every token made as documented is accepted, and
// no altered or foreign one ever is.
func FuzzPortToken(f *testing.F) {
	far := time.Now().Add(24 * time.Hour).Unix()
	for _, s := range []struct {
		id     string
		port   uint16
		exp    int64
		flip   []byte
		raw    string
		mode   uint8
		domain string
	}{
		{sandboxUser, 8000, far, nil, "", ptSigned, ""},
		{sandboxUser, 8000, far, nil, "", ptSigned | ptDomain, ""},
		{sandboxUser, 3000, far, nil, "", ptSigned | ptDomain | ptCookie, ""},
		{sandboxAdmin, 65535, far, nil, "", ptSigned, ""},
		{sandboxPaused, 8000, far, nil, "", ptSigned, ""},
		{sandboxUser, 0, far, nil, "", ptSigned, ""},
		{sandboxUser, 8000, 1, nil, "", ptSigned, ""},
		{sandboxUser, 8000, -1, nil, "", ptSigned, ""},
		{"abc", 8000, far, nil, "", ptSigned, ""},
		{"ABC", 8000, far, nil, "", ptSigned, ""},
		{"../x", 8000, far, nil, "", ptSigned | ptDomain, ""},
		{strings.Repeat("a", 65), 8000, far, nil, "", ptSigned, ""},
		{sandboxUser, 8000, far, []byte{0, 1}, "", ptSigned, ""},
		{sandboxUser, 8000, far, []byte{10, 0x80}, "", ptSigned | ptDomain, ""},
		{sandboxUser, 8000, far, []byte{47, 1}, "", ptSigned, ""},
		{sandboxUser, 8000, far, nil, "", ptSigned | ptOther, ""},
		{"", 0, 0, nil, "AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn", 0, ""},
		{"", 0, 0, nil, "", 0, ""},
		{"", 0, 0, nil, strings.Repeat("A", 200), ptDomain, ""},
		{"", 0, 0, nil, "AQ==", 0, ""},
	} {
		f.Add(s.id, s.port, s.exp, s.flip, s.raw, s.mode)
	}
	w := newWorld(f)
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	f.Fuzz(func(t *testing.T, id string, port uint16, exp int64, flip []byte, raw string, mode uint8) {
		tok := raw
		if mode&ptSigned != 0 {
			secret := urlSecret
			if mode&ptOther != 0 {
				secret = []byte("another server's url secret.....")
			}
			tok = signToken(secret, id, port, exp)
			if len(flip) >= 2 {
				b, _ := base64.RawURLEncoding.DecodeString(tok)
				b[int(flip[0])%len(b)] ^= flip[1]
				tok = base64.RawURLEncoding.EncodeToString(b)
			}
		}
		var target, hostHdr string
		var req *http.Request
		if mode&ptDomain == 0 {
			target = "/p/" + url.PathEscape(tok) + "/page?q=1"
			req, _ = http.NewRequest("GET", w.srv.URL, nil)
		} else {
			gid, gport, _, _ := grant(urlSecret, tok)
			if !host.ValidID(gid) || gport == 0 {
				gid, gport = sandboxUser, 8000 // what the token names is no host: present it at one
			}
			hostHdr = strconv.Itoa(gport) + "-" + gid + "." + proxyDomain
			target = "/page?q=1&panda_token=" + url.QueryEscape(tok)
			req, _ = http.NewRequest("POST", w.srv.URL, strings.NewReader("x")) // a POST is proxied, not redirected
			if mode&ptCookie != 0 {
				target = "/page?q=1"
				req.Method = "GET"
				req.Header.Set("Cookie", "panda_token="+tok)
			}
			req.Host = hostHdr
		}
		req.URL.Opaque = target

		w.host.begin()
		res, err := client.Do(req)
		if err != nil {
			if strings.Contains(err.Error(), "invalid") {
				return // a cookie or host the client refuses to send
			}
			t.Fatalf("token %q: %v", tok, err)
		}
		res.Body.Close()
		defer w.heal(t)
		if res.StatusCode >= 500 {
			t.Fatalf("token %q (%s, Host %q): status %d; server log:\n%s", tok, target, hostHdr, res.StatusCode, w.log.String())
		}

		// What the documented format says the token grants.
		gid, gport, gexp, valid := grant(urlSecret, tok)
		now := time.Now().Unix()
		if valid && gexp > now-2 && gexp <= now+2 {
			return // expires as we look: either answer is right
		}
		valid = valid && gexp > now && gport >= 1 && host.ValidID(gid) && (gid == sandboxUser || gid == sandboxAdmin)
		if mode&ptCookie != 0 && !(httpCookieValue(tok)) {
			valid = false // a cookie value net/http will not carry
		}
		w.host.mu.Lock()
		reached := append([]reach(nil), w.host.reached...)
		w.host.mu.Unlock()
		switch {
		case valid && (len(reached) != 1 || reached[0] != reach{gid, gport}):
			t.Fatalf("token %q granting port %d of sandbox %s until %d (%s, Host %q): reached %v, status %d; server log:\n%s",
				tok, gport, gid, gexp, target, hostHdr, reached, res.StatusCode, w.log.String())
		case !valid && len(reached) > 0:
			t.Fatalf("token %q, which the documented format does not accept (%s, Host %q): reached %v", tok, target, hostHdr, reached)
		}
	})
}

// httpCookieValue reports whether net/http sends v as a cookie value as
// it is.
func httpCookieValue(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < 0x21 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
			return false
		}
	}
	return true
}

// FuzzProxyDomain gives the server arbitrary proxy domains
// (Config.ProxyDomain, which validProxyDomain checks) and arbitrary Host
// headers, and checks: an accepted domain is a lowercase DNS name of at
// least two labels (or localhost, or none: no proxy domain); a request whose Host is
// {port}-{id}.{domain}, in any case, with or without a trailing dot or a
// port, reaches that port of that sandbox (the user's, with its key); and
// any other Host, the fuzzer's included, reaches a port only if it names
// one the same way.
func FuzzProxyDomain(f *testing.F) {
	for _, s := range []struct {
		domain, hostHdr string
		port            uint16
		variant         uint8
	}{
		{"sb.test", "", 8000, 0},
		{"sandboxes.example.com", "", 3000, 1},
		{"localhost", "", 80, 2},
		{"Upper.Example", "", 8000, 0},
		{"a..b", "", 8000, 0},
		{"-a.b", "", 8000, 0},
		{"a.b-", "", 8000, 0},
		{"nodot", "", 8000, 0},
		{"a.b", "8000-fuzzuser000000000001.a.b.c", 8000, 4},
		{"a.b", "x.8000-fuzzuser000000000001.a.b", 8000, 4},
		{"a.b", "08000-fuzzuser000000000001.a.b", 8000, 4},
		{"a.b", "8000-fuzzuser000000000001-x.a.b", 8000, 4},
		{"a.b", "8000-fuzzuser000000000001.a.b:99999", 8000, 4},
		{"a.b", "[::1]:80", 8000, 4},
		{"a.b", "8000-fuzzuser000000000001%2ea.b", 8000, 4},
		{"xn--bcher-kva.example", "", 8000, 3},
		{strings.Repeat("a", 63) + ".b", "", 8000, 0},
		{strings.Repeat("a", 64) + ".b", "", 8000, 0},
	} {
		f.Add(s.domain, s.hostHdr, s.port, s.variant)
	}
	w := newWorld(f)
	f.Fuzz(func(t *testing.T, domain, hostHdr string, port uint16, variant uint8) {
		reg := prometheus.NewRegistry()
		cp, err := controlplane.New(controlplane.Config{HostID: hostID, Logger: w.quiet}, w.cat, w.host, reg)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := rest.New(rest.Config{URLSecret: urlSecret, ProxyDomain: domain, OpenAPI: []byte("openapi: 3.0.3\n"),
			Logger: w.quiet}, cp, w.cat, w.host, reg)
		if err != nil {
			return
		}
		if domain != "" && domain != "localhost" && !validDomain(domain) {
			t.Fatalf("proxy domain %q accepted", domain)
		}
		h := srv.Handler()
		if hostHdr == "" && port != 0 {
			name := strconv.Itoa(int(port)) + "-" + sandboxUser + "." + domain
			switch variant % 4 {
			case 1:
				name = strings.ToUpper(name)
			case 2:
				name += "."
			case 3:
				name += ":443"
			}
			hostHdr = name
		}
		if strings.ContainsFunc(hostHdr, func(c rune) bool { return c < 0x21 || c == 0x7f }) {
			return // a Host header net/http's server refuses (400) before any handler
		}
		req := httptest.NewRequest("GET", "/page", nil)
		req.Host = hostHdr
		req.Header.Set("Authorization", "Bearer "+w.user)
		w.host.begin()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		defer w.heal(t)
		w.host.mu.Lock()
		reached := append([]reach(nil), w.host.reached...)
		w.host.mu.Unlock()

		// The Host the model reads: {port}-{id}.{domain}, port in
		// decimal from 1 to 65535.
		hn := hostHdr
		if h, _, err := net.SplitHostPort(hn); err == nil {
			hn = h
		}
		hn = strings.TrimSuffix(strings.ToLower(hn), ".")
		var want []reach
		if label, ok := strings.CutSuffix(hn, "."+domain); ok && domain != "" && !strings.Contains(label, ".") {
			ps, id, _ := strings.Cut(label, "-")
			if p, err := strconv.Atoi(ps); err == nil && p >= 1 && p <= 65535 && ps == strconv.Itoa(p) && id == sandboxUser {
				want = []reach{{id, p}}
			}
		}
		if len(reached) != len(want) || len(want) == 1 && reached[0] != want[0] {
			t.Fatalf("proxy domain %q, Host %q: reached %v, want %v (status %d %s)", domain, hostHdr, reached, want, rec.Code, rec.Body)
		}
		if rec.Code >= 500 && rec.Code != http.StatusBadGateway && !(rec.Code == http.StatusServiceUnavailable && strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html")) {
			t.Fatalf("proxy domain %q, Host %q: status %d %s", domain, hostHdr, rec.Code, rec.Body)
		}
	})
}

// validDomain is what a proxy domain must be: a lowercase DNS name of at
// least two labels, each of letters, digits and inner dashes, at most 63
// bytes.
func validDomain(d string) bool {
	labels := strings.Split(d, ".")
	if len(labels) < 2 || len(d) > 253 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
