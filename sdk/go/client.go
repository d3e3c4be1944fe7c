// Package pandastack is the Go client of PandaStack, a self-hostable microVM
// sandbox platform for AI agents. It speaks the REST API described by
// api/openapi.yaml with the standard library, and with Docker's own
// .dockerignore matcher (github.com/moby/patternmatcher, itself
// standard-library only) for the build contexts it sends.
//
//	c, err := pandastack.NewClient(pandastack.Options{}) // PANDASTACK_API_KEY, PANDASTACK_API_URL
//	sb, err := c.Create(ctx, pandastack.CreateOptions{Template: "base"})
//	defer sb.Kill(context.Background())
//	res, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo hello"})
//
// Every call that talks to the server takes a context; the client sets no
// timeouts of its own, because exec streams, file transfers and template
// bakes can legitimately run for a long time.
//
// Errors returned by the server are *Error values; compare them with
// errors.Is against ErrNotFound, ErrConflict, ErrQuotaExceeded and the
// other sentinels.
package pandastack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// DefaultAPIURL is the address `panda up` listens on by default.
const DefaultAPIURL = "http://127.0.0.1:7788"

// Version is the version of this client, sent in the User-Agent header.
const Version = "1.0.0"

// Options configure a Client. The zero value is valid.
type Options struct {
	// APIKey is sent as a bearer token. Default: $PANDASTACK_API_KEY.
	APIKey string
	// APIURL is the server's base URL. Default: $PANDASTACK_API_URL, then
	// DefaultAPIURL.
	APIURL string
	// HTTPClient sends the requests. Default: a client with no overall
	// timeout (use contexts to bound calls).
	HTTPClient *http.Client
	// UserAgent is added in front of this client's own User-Agent.
	UserAgent string
}

// Client talks to one PandaStack server with one API key. It is safe for
// concurrent use.
type Client struct {
	base string // without a trailing slash
	key  string
	hc   *http.Client
	ua   string
}

// NewClient returns a client for opts. It does not contact the server.
func NewClient(opts Options) (*Client, error) {
	if opts.APIKey == "" {
		opts.APIKey = os.Getenv("PANDASTACK_API_KEY")
	}
	if opts.APIURL == "" {
		opts.APIURL = os.Getenv("PANDASTACK_API_URL")
	}
	if opts.APIURL == "" {
		opts.APIURL = DefaultAPIURL
	}
	u, err := url.Parse(opts.APIURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("invalid API URL %q: want http://host:port or https://host", opts.APIURL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("invalid API URL %q: no query or fragment allowed", opts.APIURL)
	}
	if strings.ContainsAny(opts.APIKey, " \t\r\n") {
		return nil, errors.New("invalid API key: it contains white space")
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	ua := "pandastack-go/" + Version
	if opts.UserAgent != "" {
		ua = opts.UserAgent + " " + ua
	}
	return &Client{base: strings.TrimRight(u.String(), "/"), key: opts.APIKey, hc: hc, ua: ua}, nil
}

// APIURL returns the server's base URL.
func (c *Client) APIURL() string { return c.base }

// Health is the answer of GET /healthz.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version,omitempty"`
}

// Health asks the server whether it is up. It needs no API key.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.doJSON(ctx, http.MethodGet, "/healthz", nil, nil, &h)
	return h, err
}

// path joins escaped path segments under /v1.
func path(segments ...string) string {
	var b strings.Builder
	b.WriteString("/v1")
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// newRequest builds a request for the API path p (already escaped).
func (c *Client) newRequest(ctx context.Context, method, p string, q url.Values, body io.Reader, contentType string) (*http.Request, error) {
	u := c.base + p
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("build request %s %s: %w", method, p, err)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	req.Header.Set("User-Agent", c.ua)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req, nil
}

// send sends req and returns the response if its status is 2xx. Any other
// status becomes an *Error (the body is read and closed); a failure to
// connect becomes an error that says where the server was expected.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, ctxErr)
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, &unreachableError{url: c.base, err: err}
		}
		var dns *net.DNSError
		if errors.As(err, &dns) {
			return nil, &unreachableError{url: c.base, err: err}
		}
		return nil, fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, errorFromResponse(resp)
	}
	return resp, nil
}

// doJSON sends in (if not nil) as JSON and decodes a 2xx answer into out
// (if not nil).
func (c *Client) doJSON(ctx context.Context, method, p string, q url.Values, in, out any) error {
	var body io.Reader
	ct := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
		ct = "application/json"
	}
	req, err := c.newRequest(ctx, method, p, q, body, ct)
	if err != nil {
		return err
	}
	if out != nil {
		req.Header.Set("Accept", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, p, err)
	}
	return nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// decodeJSON decodes one JSON value from r into out.
func decodeJSON(r io.Reader, out any) error {
	if err := json.NewDecoder(r).Decode(out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}
