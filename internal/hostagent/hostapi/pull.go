package hostapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// The one call a host agent makes to another: fetching the pack of a
// snapshot straight from the agent that holds it (POST
// …/snapshots/{id}/pack/pull, host.PackPuller), with the ticket the
// control plane gave it (hostwire.PackTicket). It is this small piece of
// a client, not the control plane's (internal/controlplane/hostclient):
// host code does not reach control-plane code.

// peer is the host agent a pack comes from, allowed only to fetch the
// pack its ticket grants.
type peer struct {
	base   string // URL + hostwire.Prefix
	ticket string
	http   *http.Client
}

// newPeer is the agent from names; its errors are host.ErrInvalid.
func newPeer(from host.PackSource) (*peer, error) {
	u, err := url.Parse(from.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: pack source url %q: want https://host:port", host.ErrInvalid, from.URL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext
	tr.DisableCompression = true
	// HTTP/1.1, as the agent serves it.
	tr.ForceAttemptHTTP2 = false
	tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	if u.Scheme == "https" {
		// The source agent's CA only, as the control plane trusts it.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(from.CACert)) {
			return nil, fmt.Errorf("%w: pack source's CA certificate: read agent CA: no PEM certificate", host.ErrInvalid)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	}
	return &peer{base: strings.TrimRight(u.String(), "/") + hostwire.Prefix, ticket: from.Ticket, http: &http.Client{Transport: tr}}, nil
}

// close releases the peer's idle connections.
func (p *peer) close() { p.http.CloseIdleConnections() }

// pack opens snapshot id's pack (GET /snapshots/{id}/pack), for a host
// that holds the durable snapshots held (hostwire's ?held=). An error the
// peer meets once the stream has begun ends it with that error (the
// X-Panda-Error trailer), not EOF; failing to reach the peer is
// host.ErrUnavailable (*host.UnreachableError).
func (p *peer) pack(ctx context.Context, id string, held []string) (io.ReadCloser, error) {
	u := p.base + "/snapshots/" + url.PathEscape(id) + "/pack"
	if len(held) > 0 {
		u += "?" + url.Values{"held": {strings.Join(held, ",")}}.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Ticket "+p.ticket)
	res, err := p.http.Do(req)
	if err != nil {
		return nil, p.transportError(ctx, err)
	}
	if res.StatusCode/100 != 2 {
		defer res.Body.Close()
		return nil, hostwire.ReadError(res)
	}
	return &peerPack{p: p, ctx: ctx, res: res}, nil
}

func (p *peer) transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &host.UnreachableError{Addr: p.base, Err: err}
}

// peerPack is a pack coming from a peer; at its end it reports the error
// the peer sent in the trailer, if any, instead of EOF.
type peerPack struct {
	p   *peer
	ctx context.Context
	res *http.Response
}

func (r *peerPack) Read(b []byte) (int, error) {
	n, err := r.res.Body.Read(b)
	switch {
	case err == io.EOF: // the end itself, not an error wrapping EOF
		if terr := hostwire.TrailerError(r.res); terr != nil {
			return n, terr
		}
	case err != nil:
		err = r.p.transportError(r.ctx, err)
	}
	return n, err
}

func (r *peerPack) Close() error { return r.res.Body.Close() }
