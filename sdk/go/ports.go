package pandastack

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// Port is a TCP port listening in a sandbox.
type Port struct {
	Port int `json:"port"`
	// Address is the address it listens on: 0.0.0.0 or :: for every
	// address (only those are reachable through the server), 127.0.0.1...
	Address string `json:"address"`
}

// Ports lists the TCP ports listening in the running sandbox, IPv4 and
// IPv6, sorted by port.
func (s *Sandbox) Ports(ctx context.Context) ([]Port, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	var out struct {
		Ports []Port `json:"ports"`
	}
	if err := s.c.doJSON(ctx, http.MethodGet, path("sandboxes", s.ID, "ports"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Ports, nil
}

// PortURL is a signed URL of a port of a sandbox.
type PortURL struct {
	// URL reaches the port without an API key (any path under it, any
	// method, WebSockets), e.g. http://127.0.0.1:7788/p/TOKEN/, or on the
	// server's proxy domain https://8000-ID.sbx.example.com/?panda_token=TOKEN.
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// URL signs a URL that reaches port of the sandbox without an API key
// until ttl has passed (rounded up to whole seconds; 0: the server's
// default, one hour; at most the server's max TTL), while the sandbox runs.
// Anyone with the URL can use it: there is no revoking it but killing the
// sandbox.
func (s *Sandbox) URL(ctx context.Context, port int, ttl time.Duration) (PortURL, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return PortURL{}, err
	}
	if port < 1 || port > 65535 {
		return PortURL{}, newError(0, CodeInvalid, "port "+strconv.Itoa(port)+" is not between 1 and 65535")
	}
	if ttl < 0 {
		return PortURL{}, newError(0, CodeInvalid, "ttl must not be negative")
	}
	in := wire.SignPortURLJSONRequestBody{TtlSeconds: optional(int((ttl + time.Second - 1) / time.Second))}
	var out PortURL
	err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "ports", strconv.Itoa(port), "url"), nil, in, &out)
	return out, err
}

// PortProxyURL is the base URL of port of the sandbox through the server,
// for requests that carry the API key (Authorization: Bearer): any method,
// path and query after it, WebSockets too, reach the sandbox's server on
// that port. It makes no request.
func (s *Sandbox) PortProxyURL(port int) string {
	return s.c.base + path("sandboxes", s.ID, "ports", strconv.Itoa(port)) + "/"
}
