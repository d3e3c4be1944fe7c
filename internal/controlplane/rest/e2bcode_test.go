package rest_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
)

// TestE2BCodeInterpreter: the code interpreter SDK's requests
// (E2b-Sandbox-Port 49999, or the host 49999-ID.DOMAIN) reach port 49999
// of the sandbox's guest through the port proxy, with the sandbox's E2B
// tokens only, and none of the server's credentials reach the guest; the
// host 49983-ID.DOMAIN is envd, served by the E2B layer, not proxied.
func TestE2BCodeInterpreter(t *testing.T) {
	world(t)
	const domain = "code.test"
	srv2, cp2, err := newServer(rest.Config{
		ProxyDomain: domain, ProxyHeaderTimeout: proxyHeaderTimeout, OpenAPI: []byte("openapi: 3.0.3\n"), Logger: slog.New(slog.DiscardHandler),
	}, controlplane.Config{}, e.cat, e.h)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv2.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv2.Shutdown()
		cp2.Shutdown(ctx)
		hs.Close()
	})
	key := newKey(t, "e2b-code", nil)
	sb, other := create(t, key, nil), create(t, key, nil)
	left := make(chan struct{}, 1) // the slow stream's client went away
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		fmt.Fprintln(w, `{"type":"stdout","text":"started"}`)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		left <- struct{}{}
	})
	serve(t, sb.ID, 49999, mux)

	type tokens struct{ EnvdAccessToken, TrafficAccessToken string }
	tokensOf := func(id string) tokens {
		t.Helper()
		var tk tokens
		r := call(t, "POST", hs.URL+"/sandboxes/"+id+"/connect", strings.NewReader(`{}`), map[string]string{"X-API-KEY": key, "Content-Type": "application/json"})
		r.json(t, &tk)
		if tk.EnvdAccessToken == "" || tk.TrafficAccessToken == "" || tk.EnvdAccessToken == tk.TrafficAccessToken {
			t.Fatalf("E2B connect %s: %d %s, want two tokens", id, r.status, r.body)
		}
		return tk
	}
	tk, otherTk := tokensOf(sb.ID), tokensOf(other.ID)
	var got tokens
	call(t, "GET", hs.URL+"/sandboxes/"+sb.ID, nil, map[string]string{"X-API-KEY": key}).json(t, &got)
	if got.TrafficAccessToken != tk.TrafficAccessToken || got.EnvdAccessToken != "" {
		t.Errorf("E2B get: tokens %+v, want the traffic token only", got)
	}

	// byHeader is a request as the SDK sends it with E2B_SANDBOX_URL set
	// to the server; byHost, as it sends it to the proxy domain.
	byHeader := func(id string, hdr map[string]string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999"}
		for k, v := range hdr {
			h[k] = v
		}
		return h
	}
	byHost := func(id string, hdr map[string]string) map[string]string {
		h := map[string]string{"Host": "49999-" + id + "." + domain, "E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999"}
		for k, v := range hdr {
			h[k] = v
		}
		return h
	}
	routes := map[string]func(string, map[string]string) map[string]string{"by header": byHeader, "by host": byHost}

	for name, route := range routes {
		t.Run("proxied "+name, func(t *testing.T) {
			secrets := map[string]string{
				"X-Access-Token": tk.EnvdAccessToken, "E2B-Traffic-Access-Token": tk.TrafficAccessToken,
				"Authorization": "Bearer " + key, "X-API-Key": key, "Content-Type": "application/json",
			}
			r := call(t, "POST", hs.URL+"/execute?a=1", strings.NewReader(`{"code":"1+1"}`), route(sb.ID, secrets))
			echo := r.echo(t)
			if echo.Method != "POST" || echo.Path != "/execute" || echo.Query != "a=1" || echo.Body != `{"code":"1+1"}` {
				t.Errorf("the guest saw %+v", echo)
			}
			for _, s := range []string{key, tk.EnvdAccessToken, tk.TrafficAccessToken} {
				if strings.Contains(string(r.body), s) {
					t.Errorf("a credential of the server reached the guest: %s", r.body)
				}
			}
			// The traffic token alone does for the context calls.
			r = call(t, "DELETE", hs.URL+"/contexts/c1", nil, route(sb.ID, map[string]string{"E2B-Traffic-Access-Token": tk.TrafficAccessToken}))
			if echo := r.echo(t); echo.Method != "DELETE" || echo.Path != "/contexts/c1" || echo.Header.Get("E2b-Traffic-Access-Token") != "" {
				t.Errorf("the guest saw %+v", echo)
			}
		})
		t.Run("refused "+name, func(t *testing.T) {
			before := guests.dialed(sb.ID, 49999)
			for what, hdr := range map[string]map[string]string{
				"no token":                        nil,
				"another sandbox's access token":  {"X-Access-Token": otherTk.EnvdAccessToken},
				"another sandbox's traffic token": {"E2B-Traffic-Access-Token": otherTk.TrafficAccessToken},
				"the API key as tokens":           {"X-Access-Token": key, "E2B-Traffic-Access-Token": key},
				"the API key":                     {"Authorization": "Bearer " + key, "X-API-Key": key},
			} {
				body := &countingBody{r: strings.NewReader(`{"code":"print(1)"}`)}
				req, err := http.NewRequest("POST", hs.URL+"/execute", body)
				if err != nil {
					t.Fatal(err)
				}
				for k, v := range route(sb.ID, hdr) {
					if k == "Host" {
						req.Host = v
					} else {
						req.Header.Set(k, v)
					}
				}
				req.ContentLength = -1 // sent as it is read
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"code":401`) {
					t.Errorf("%s: %d %s, want 401", what, res.StatusCode, b)
				}
			}
			if n := guests.dialed(sb.ID, 49999); n != before {
				t.Errorf("refused requests reached the guest: %d dials", n-before)
			}
		})
	}

	t.Run("client leaving ends the guest's request", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "POST", hs.URL+"/slow", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("E2b-Sandbox-Id", sb.ID)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		req.Header.Set("X-Access-Token", tk.EnvdAccessToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		line, err := bufio.NewReader(res.Body).ReadString('\n')
		if err != nil || !strings.Contains(line, "started") {
			t.Fatalf("first line %q, %v", line, err)
		}
		cancel()
		select {
		case <-left:
		case <-time.After(time.Minute):
			t.Fatal("the guest's request did not end within a minute of the client leaving")
		}
	})

	t.Run("envd by host", func(t *testing.T) {
		before := guests.dialed(sb.ID, 49983)
		r := call(t, "GET", hs.URL+"/health", nil, map[string]string{"Host": "49983-" + sb.ID + "." + domain, "X-Access-Token": tk.EnvdAccessToken})
		if r.status != http.StatusNoContent {
			t.Errorf("GET /health on 49983-ID: %d %s, want envd's 204", r.status, r.body)
		}
		for what, hdr := range map[string]map[string]string{
			"no token":                {},
			"the traffic token":       {"E2B-Traffic-Access-Token": tk.TrafficAccessToken},
			"another sandbox's token": {"X-Access-Token": otherTk.EnvdAccessToken},
			"the API key":             {"Authorization": "Bearer " + key},
		} {
			hdr["Host"] = "49983-" + sb.ID + "." + domain
			if r := call(t, "GET", hs.URL+"/health", nil, hdr); r.status != http.StatusUnauthorized {
				t.Errorf("envd by host with %s: %d %s, want 401", what, r.status, r.body)
			}
		}
		if n := guests.dialed(sb.ID, 49983); n != before {
			t.Errorf("envd's host was proxied to the guest's port 49983: %d dials", n-before)
		}
		// Other ports of the proxy domain are still the port proxy's.
		expect(t, call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": "8000-" + sb.ID + "." + domain, "Authorization": "Bearer " + key}), 502, "bad_gateway")
	})

	t.Run("no code interpreter, not running", func(t *testing.T) {
		r := call(t, "GET", hs.URL+"/contexts", nil, byHeader(other.ID, map[string]string{"E2B-Traffic-Access-Token": otherTk.TrafficAccessToken}))
		if r.status != http.StatusBadGateway || !strings.Contains(r.message(), "has no code interpreter") {
			t.Errorf("a sandbox without a code interpreter: %d %s, want 502 saying so", r.status, r.body)
		}
		expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+other.ID, nil), 204, "")
		r = call(t, "GET", hs.URL+"/contexts", nil, byHeader(other.ID, map[string]string{"E2B-Traffic-Access-Token": otherTk.TrafficAccessToken}))
		if r.status != http.StatusBadGateway || !strings.Contains(string(r.body), "not running") {
			t.Errorf("a killed sandbox: %d %s, want 502 not running", r.status, r.body)
		}
	})

	t.Run("port proxy drops the traffic token", func(t *testing.T) {
		serve(t, sb.ID, 8000, http.HandlerFunc(echoHandler))
		u := hs.URL + "/v1/sandboxes/" + sb.ID + "/ports/8000/x"
		got := call(t, "GET", u, nil, map[string]string{"Authorization": "Bearer " + key, "E2B-Traffic-Access-Token": tk.TrafficAccessToken}).echo(t)
		if v := got.Header.Get("E2b-Traffic-Access-Token"); v != "" {
			t.Errorf("the guest got E2B-Traffic-Access-Token %q", v)
		}
		// Another value is the guest application's own.
		got = call(t, "GET", u, nil, map[string]string{"Authorization": "Bearer " + key, "E2B-Traffic-Access-Token": "theirs"}).echo(t)
		if v := got.Header.Get("E2b-Traffic-Access-Token"); v != "theirs" {
			t.Errorf("the guest got E2B-Traffic-Access-Token %q, want theirs", v)
		}
	})
}
