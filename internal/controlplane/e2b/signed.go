package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// signedFileURL reports whether r is a signed file URL of the SDK's
// uploadUrl or downloadUrl: /files with a signature in its query.
func signedFileURL(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Has("signature")
}

// signatureRaw is what envd's file URL signature hashes: path:operation:
// user:token, with ":expiration" appended when it expires (the SDK's
// getSignature).
func signatureRaw(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	return raw
}

// signedFile is a signed file URL's claim: the operation on path as user
// until expiration, and the SHA-256 of signatureRaw that its signature
// ("v1_" and the unpadded base64 of the sum) carries.
type signedFile struct {
	path, op, user, expiration string
	sum                        [sha256.Size]byte
}

// signedBy reports whether the claim was signed with token, in constant
// time. It is the whole per-sandbox cost of finding a signer: one SHA-256
// of a short string.
func (c *signedFile) signedBy(s *Server, token string) bool {
	s.work.signatures.Add(1)
	sum := sha256.Sum256([]byte(signatureRaw(c.path, c.op, c.user, token, c.expiration)))
	return subtle.ConstantTimeCompare(sum[:], c.sum[:]) == 1
}

// parseSignedFile reads the claim of signed file URL r: op is "read" for
// GET, "write" for POST. An expired URL, or a signature that is not of
// the form "v1_" + 43 base64 characters, is refused here, before any
// hashing.
func parseSignedFile(r *http.Request) (*signedFile, error) {
	q := r.URL.Query()
	c := &signedFile{path: q.Get("path"), op: "read", user: q.Get("username"), expiration: q.Get("signature_expiration")}
	if r.Method == http.MethodPost {
		c.op = "write"
	}
	if c.expiration != "" {
		at, err := strconv.ParseInt(c.expiration, 10, 64)
		if err != nil {
			return nil, errStatus(http.StatusBadRequest, "signature_expiration %q is not a Unix time", c.expiration)
		}
		if time.Now().Unix() > at {
			return nil, errStatus(http.StatusUnauthorized, "the file URL's signature expired at %s", time.Unix(at, 0).UTC().Format(time.RFC3339))
		}
	}
	enc, ok := strings.CutPrefix(q.Get("signature"), "v1_")
	if !ok || base64.RawStdEncoding.DecodedLen(len(enc)) != sha256.Size {
		return nil, errInvalidSignature
	}
	sum, err := base64.RawStdEncoding.DecodeString(enc)
	if err != nil {
		return nil, errInvalidSignature
	}
	copy(c.sum[:], sum)
	return c, nil
}

var errInvalidSignature = errStatus(http.StatusUnauthorized, "invalid signature for this file operation (path, user and operation must be those it was made for)")

// signer authenticates signed file URL r and returns its sandbox: the one
// the request names (E2b-Sandbox-Id), whose token is checked, or, for a
// URL that names none (the SDK's uploadUrl and downloadUrl with a shared
// E2B_SANDBOX_URL carry only path, username and signature), the running
// sandbox whose token made the signature.
//
// Such an anonymous URL cannot be routed in constant time: the signature
// is a SHA-256 over the path and the token, so finding its sandbox means
// trying the running sandboxes' tokens one by one. What one request may
// cost is bounded instead: each sandbox's token is derived once (not per
// request: work.tokens does not grow with requests), a try is one SHA-256
// of a short string, and one search runs at a time in the whole server,
// so however many anonymous requests arrive they hold at most one core.
func (s *Server) signer(r *http.Request, named string) (string, error) {
	c, err := parseSignedFile(r)
	if err != nil {
		return "", err
	}
	if named != "" {
		if c.signedBy(s, s.AccessToken(named)) {
			return named, nil
		}
		return "", errInvalidSignature
	}
	select {
	case s.search <- struct{}{}:
		defer func() { <-s.search }()
	case <-r.Context().Done():
		return "", errStatus(499, "the request was canceled while waiting to check its signature")
	}
	ids, err := s.b.Running(r.Context())
	if err != nil {
		return "", err
	}
	return s.searchSigner(ids, c)
}

// searchSigner tries the tokens of the sandboxes ids for c's signer. The
// caller holds s.search, which guards s.tokens.
func (s *Server) searchSigner(ids []string, c *signedFile) (string, error) {
	tokens := make(map[string]string, len(ids)) // the running ones': the others' are dropped
	found := ""
	for _, id := range ids {
		tok, ok := s.tokens[id]
		if !ok {
			if found != "" {
				continue // no token is derived after the signer is found
			}
			tok = s.AccessToken(id)
		}
		tokens[id] = tok
		if found == "" && c.signedBy(s, tok) {
			found = id
		}
	}
	s.tokens = tokens
	if found == "" {
		return "", errInvalidSignature
	}
	return found, nil
}

// signerContext is ctx carrying the sandbox an envd request proved access
// to (serveEnvd).
func signerContext(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, sandboxKey{}, id)
}

type sandboxKey struct{}
