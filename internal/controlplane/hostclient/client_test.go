package hostclient_test

// Unit tests of the client's own logic against a scripted agent (an
// httptest server speaking hostwire): what it sends, and how it classifies
// what comes back. The client against a real agent (QEMU guests) is
// tested in internal/hostagent/hostapi.

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
)

const token = "pandaagent_test"

var info = hostwire.Info{Accel: accel.TCG, Defaults: templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1},
	Resources: host.Resources{VCPUs: 2, MemoryMiB: 4096}, NetworkOff: true}

// agent is a scripted agent: GET /info answers info to the right token;
// other paths are handled by routes.
func agent(t *testing.T, routes map[string]http.HandlerFunc) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(agentHandler(routes))
	t.Cleanup(s.Close)
	return s
}

func agentHandler(routes map[string]http.HandlerFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+hostwire.Prefix+"/info", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			writeError(w, fmt.Errorf("%w: send Authorization: Bearer <agent token>", hostwire.ErrUnauthorized))
			return
		}
		json.NewEncoder(w).Encode(info)
	})
	for pattern, h := range routes {
		mux.HandleFunc(pattern, h)
	}
	return mux
}

func writeError(w http.ResponseWriter, err error) {
	status, we := hostwire.EncodeError(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(hostwire.ErrorBody{Error: we})
}

func dial(t *testing.T, s *httptest.Server, opts ...hostclient.Option) *hostclient.Client {
	t.Helper()
	c, err := hostclient.Dial(s.URL, token, opts...)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDial: Dial checks the token and learns the agent's Info, from which
// the methods without a ctx answer.
func TestDial(t *testing.T) {
	s := agent(t, nil)
	c := dial(t, s)
	if got := c.Info(); got != info {
		t.Errorf("info: got %+v, want %+v", got, info)
	}
	if c.Accel() != accel.TCG || !c.NetworkOff() {
		t.Errorf("accel %q, network off %v: want tcg, true", c.Accel(), c.NetworkOff())
	}
	if got, want := c.TemplateParams("", 0, 4), (templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 4}); got != want {
		t.Errorf("template params: got %+v, want %+v", got, want)
	}

	if _, err := hostclient.Dial(s.URL, "wrong"); !errors.Is(err, hostwire.ErrUnauthorized) {
		t.Errorf("wrong token: got %v, want ErrUnauthorized", err)
	}
	for _, u := range []string{"ftp://h:1", "h:1", "https://"} {
		if _, err := hostclient.Dial(u, token); err == nil || !strings.Contains(err.Error(), "want https://host:port") {
			t.Errorf("url %q: got %v", u, err)
		}
	}
}

// TestErrors: an agent's error comes back with its class and text; what
// is not the agent's answer, or no answer at all, is unavailable.
func TestErrors(t *testing.T) {
	s := agent(t, map[string]http.HandlerFunc{
		"GET " + hostwire.Prefix + "/sandboxes/{id}": func(w http.ResponseWriter, r *http.Request) {
			switch r.PathValue("id") {
			case "gone":
				writeError(w, fmt.Errorf("sandbox gone: %w", host.ErrNotFound))
			case "proxy":
				http.Error(w, "<html>bad gateway</html>", http.StatusBadGateway)
			}
		},
	})
	c := dial(t, s)
	ctx := context.Background()
	if _, err := c.Get(ctx, "gone"); !errors.Is(err, host.ErrNotFound) || err.Error() != "sandbox gone: not found" {
		t.Errorf("agent's error: got %v", err)
	}
	if _, err := c.Get(ctx, "proxy"); !errors.Is(err, host.ErrUnavailable) || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Errorf("a proxy's answer: got %v", err)
	}
	s.Close()
	_, err := c.Get(ctx, "gone")
	var ue *host.UnreachableError
	if !errors.Is(err, host.ErrUnavailable) || !errors.As(err, &ue) {
		t.Errorf("agent down: got %v, want a *host.UnreachableError", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Get(cctx, "gone"); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: got %v, want context.Canceled", err)
	}
}

// TestUntrusted: an agent whose certificate the client's CA did not sign
// is untrusted, and unavailable.
func TestUntrusted(t *testing.T) {
	s := httptest.NewTLSServer(agentHandler(nil))
	defer s.Close()
	// No CA at all: none signed the agent's certificate.
	_, err := hostclient.Dial(s.URL, token, hostclient.WithTLS(&tls.Config{RootCAs: x509.NewCertPool()}))
	if !errors.Is(err, hostclient.ErrUntrusted) || !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("got %v, want ErrUntrusted and ErrUnavailable", err)
	}
	if _, err := hostclient.ClientTLSFromPEM([]byte("no pem")); err == nil {
		t.Error("ClientTLSFromPEM took no PEM")
	}
}

// TestPackSource: a ticket the agent can check with its token's hash, for
// that snapshot; none for an https agent whose CA the client lacks.
func TestPackSource(t *testing.T) {
	c := dial(t, agent(t, nil), hostclient.WithCACert("PEM"))
	src, ok := c.PackSource("sn1", time.Minute)
	if !ok || src.CACert != "PEM" || strings.HasSuffix(src.URL, hostwire.Prefix) {
		t.Fatalf("got %+v, %v", src, ok)
	}
	key := sha256.Sum256([]byte(token))
	if !hostwire.TicketGrants(key, src.Ticket, "sn1", time.Now()) || hostwire.TicketGrants(key, src.Ticket, "sn2", time.Now()) {
		t.Errorf("ticket %s does not grant sn1's pack alone", src.Ticket)
	}

	s := httptest.NewTLSServer(agentHandler(nil))
	defer s.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	cfg, err := hostclient.ClientTLSFromPEM(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := hostclient.Dial(s.URL, token, hostclient.WithTLS(cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if src, ok := tc.PackSource("sn1", time.Minute); ok {
		t.Errorf("https without the CA: got %+v", src)
	}
}

// TestWatch: the event stream's hello calls Connected, its exits Exited
// with their cause; a stream that ends is reconnected.
func TestWatch(t *testing.T) {
	s := agent(t, map[string]http.HandlerFunc{
		"GET " + hostwire.Prefix + "/events": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-ndjson")
			enc := json.NewEncoder(w)
			enc.Encode(hostwire.Event{Type: hostwire.EventHello, Info: &info})
			enc.Encode(hostwire.Event{Type: hostwire.EventExit, ID: "a", Reason: hostwire.ReasonExited, Error: "qemu died"})
			enc.Encode(hostwire.Event{Type: hostwire.EventExit, ID: "b", Reason: hostwire.ReasonShutdown, Error: "agent stopping"})
			// The stream ends here: the client comes back.
		},
	})
	c := dial(t, s)
	type exit struct {
		id  string
		err error
	}
	exits := make(chan exit, 16)
	connected := make(chan struct{}, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- c.Watch(ctx, hostclient.Watcher{
			// Never blocking: the client reconnects for as long as
			// the test runs.
			Connected: func(context.Context) error {
				select {
				case connected <- struct{}{}:
				default:
				}
				return nil
			},
			Exited: func(id string, err error) {
				select {
				case exits <- exit{id, err}:
				default:
				}
			},
		})
	}()
	deadline := time.After(30 * time.Second)
	for i := range 2 { // two streams: the first, and the reconnection
		select {
		case <-connected:
		case <-deadline:
			t.Fatalf("stream %d: Connected not called", i)
		}
		for _, want := range []string{"a", "b"} {
			var e exit
			select {
			case e = <-exits:
			case <-deadline:
				t.Fatalf("stream %d: no exit of %s", i, want)
			}
			switch {
			case e.id != want:
				t.Errorf("exit of %s, want %s", e.id, want)
			case want == "a" && (e.err == nil || e.err.Error() != "qemu died" || errors.Is(e.err, host.ErrHostShutdown)):
				t.Errorf("exit of a: got %v, want qemu died", e.err)
			case want == "b" && !errors.Is(e.err, host.ErrHostShutdown):
				t.Errorf("exit of b: got %v, want host.ErrHostShutdown", e.err)
			}
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Watch: got %v, want nil once ctx ends", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Watch did not return after ctx ended")
	}
}
