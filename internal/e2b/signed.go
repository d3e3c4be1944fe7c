package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"time"
)

// signedFileURL reports whether r is a signed file URL of the SDK's
// uploadUrl or downloadUrl: /files with a signature in its query.
func signedFileURL(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Has("signature")
}

// fileSignature is the signature envd checks on a file URL: "v1_" and
// the unpadded base64 of the SHA-256 of path:operation:user:token, with
// ":expiration" appended when it expires (the SDK's getSignature).
func fileSignature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// fileTarget authenticates a /files request for op ("read" or "write")
// and reaches its sandbox: by X-Access-Token, as every envd request, or
// by a signature (uploadUrl, downloadUrl), which needs no header. A signed
// URL without E2b-Sandbox-Id (a browser's, or any client's through a
// shared E2B_SANDBOX_URL) is routed to the running sandbox whose access
// token made its signature.
func (s *Server) fileTarget(r *http.Request, op string) (envdTarget, error) {
	q := r.URL.Query()
	user := q.Get("username")
	if !q.Has("signature") {
		return s.target(r.Context(), r.Header, user)
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return envdTarget{}, errStatus(http.StatusBadRequest, "signature_expiration %q is not a Unix time", exp)
		}
		if time.Now().Unix() > at {
			return envdTarget{}, errStatus(http.StatusUnauthorized, "the file URL's signature expired at %s", time.Unix(at, 0).UTC().Format(time.RFC3339))
		}
	}
	sig := []byte(q.Get("signature"))
	signedBy := func(id string) bool {
		want := fileSignature(q.Get("path"), op, user, s.AccessToken(id), exp)
		return subtle.ConstantTimeCompare(sig, []byte(want)) == 1
	}
	id, err := s.signer(r.Context(), r.Header.Get("E2b-Sandbox-Id"), signedBy)
	if err != nil {
		return envdTarget{}, err
	}
	return s.reach(r.Context(), id, r.Header, user)
}

// signer is the sandbox whose token made a signature (signedBy): id if
// the request names one, else one of the running sandboxes.
func (s *Server) signer(ctx context.Context, id string, signedBy func(string) bool) (string, error) {
	invalid := errStatus(http.StatusUnauthorized, "invalid signature for this file operation (path, user and operation must be those it was made for)")
	if id != "" {
		if signedBy(id) {
			return id, nil
		}
		return "", invalid
	}
	ids, err := s.b.Running(ctx)
	if err != nil {
		return "", err
	}
	for _, id := range ids {
		if signedBy(id) {
			return id, nil
		}
	}
	return "", invalid
}
