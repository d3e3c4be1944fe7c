package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
)

// The ports of a sandbox that E2B's SDKs address, by the E2b-Sandbox-Port
// header or by the host PORT-ID.DOMAIN: envd's, which this package serves
// itself over the guest agent, and the code interpreter's
// (@e2b/code-interpreter's JUPYTER_PORT), which is the guest's own code
// server (the code-interpreter template's), reverse-proxied.
const (
	EnvdPort = 49983
	CodePort = 49999
)

// TrafficAccessToken is sandbox id's traffic access token, which create,
// connect, fork and get answer as trafficAccessToken: the code
// interpreter SDK sends it (E2B-Traffic-Access-Token) with every request
// to the code interpreter, whose context calls carry no X-Access-Token.
// An HMAC of the id like AccessToken, under a label of its own, so that
// it grants the code interpreter's port and not envd (commands, files).
func (s *Server) TrafficAccessToken(id string) string {
	s.work.tokens.Add(1)
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("e2b traffic access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// ServePort serves a request that came by its host, PORT-ID.DOMAIN on the
// proxy domain (where E2B's SDKs send it without E2B_SANDBOX_URL), if port
// is E2B's: envd (EnvdPort) or the code interpreter (CodePort), for
// sandbox id whatever E2b-Sandbox-Id says. It reports whether it served
// r; any other port is the caller's (its port proxy).
func (s *Server) ServePort(w http.ResponseWriter, r *http.Request, id string, port int) bool {
	switch port {
	case EnvdPort:
		s.serveEnvd(w, r, id)
	case CodePort:
		s.serveCode(w, r, id)
	default:
		return false
	}
	return true
}

// serveCode serves a request for the code interpreter of sandbox id: it
// authenticates it from its headers alone (codeAccess) and answers a
// failure at once, unread, then hands it to the Backend's port proxy,
// which streams its body to the guest's port CodePort and the answer
// back. A sandbox that is gone or not running is 502, as for envd (the
// SDK's TimeoutError).
func (s *Server) serveCode(w http.ResponseWriter, r *http.Request, id string) {
	if err := s.codeAccess(r, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.b.Proxy(w, r, id, CodePort); err != nil {
		s.writeError(w, r, s.unreachable(id, err))
	}
}

// codeAccess checks that r proved access to sandbox id's code interpreter:
// it carries an X-Access-Token or an E2B-Traffic-Access-Token, and every
// value of those headers is the sandbox's access token or its traffic
// access token respectively (compared in constant time). The SDK sends
// the traffic token with every request and the access token with
// /execute only; a wrong one next to a right one is refused, not
// ignored.
func (s *Server) codeAccess(r *http.Request, id string) error {
	n := 0
	for _, c := range []struct {
		header string
		token  func(string) string
	}{{"X-Access-Token", s.AccessToken}, {"E2b-Traffic-Access-Token", s.TrafficAccessToken}} {
		vals := r.Header.Values(c.header)
		if len(vals) == 0 {
			continue
		}
		want := []byte(c.token(id))
		for _, v := range vals {
			if !hmac.Equal([]byte(v), want) {
				return errStatus(http.StatusUnauthorized, "wrong %s for sandbox %q", c.header, id)
			}
			n++
		}
	}
	if n == 0 {
		return errStatus(http.StatusUnauthorized,
			"missing credentials for sandbox %q's code interpreter: send its X-Access-Token or E2B-Traffic-Access-Token (create and connect answer them)", id)
	}
	return nil
}
