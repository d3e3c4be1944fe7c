package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// e2bTokens are a sandbox's E2B tokens, as E2B's connect answers them to
// its key.
type e2bTokens struct {
	Access  string `json:"envdAccessToken"`
	Traffic string `json:"trafficAccessToken"`
}

func (w *secWorld) e2bTokens(t *testing.T, ctx context.Context, key, id string) e2bTokens {
	t.Helper()
	code, b := w.mustDo(t, ctx, "", "POST", "/sandboxes/"+id+"/connect", map[string]any{}, http.Header{"X-Api-Key": {key}})
	var tk e2bTokens
	if code != http.StatusOK || json.Unmarshal(b, &tk) != nil || tk.Access == "" || tk.Traffic == "" {
		t.Fatalf("E2B connect %s: %d %s, want both tokens", id, code, b)
	}
	return tk
}

// TestSecurityE2BCode attacks the E2B code interpreter's route, black-box:
// requests for port 49999 of Alice's sandbox, sent as the
// @e2b/code-interpreter SDK sends them (E2b-Sandbox-Id, E2b-Sandbox-Port:
// 49999, to the API's address), reach the recorder listening there (busybox
// httpd in the tiny template) only with that sandbox's own access or
// traffic token. No token, Bob's sandbox's tokens, Alice's API key as a
// token or as a key are refused (401) before the guest sees anything; the
// requests let in carry none of the server's credentials to the guest.
func TestSecurityE2BCode(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, bobs := w.sandbox(t, ctx, w.Alice), w.sandbox(t, ctx, w.Bob)
	writeFile(t, ctx, sb, "/tmp/www/cgi-bin/rec", recorderCGI)
	mustExec(t, ctx, sb, "chmod 755 /tmp/www/cgi-bin/rec && busybox httpd -p 49999 -h /tmp/www")
	alice, bob := w.e2bTokens(t, ctx, w.Alice, sb.ID), w.e2bTokens(t, ctx, w.Bob, bobs.ID)
	if alice.Access == alice.Traffic || alice.Access == bob.Access || alice.Traffic == bob.Traffic {
		t.Fatalf("tokens not distinct: Alice's %+v, Bob's %+v", alice, bob)
	}
	post := func(id string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", w.URL()+"/cgi-bin/rec?a=1", strings.NewReader(`{"code":"print(1)"}`))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return send(t, w.hc, req)
	}

	for what, hdr := range map[string]map[string]string{
		"no token":                                nil,
		"Bob's sandbox's access token":            {"X-Access-Token": bob.Access},
		"Bob's sandbox's traffic token":           {"E2B-Traffic-Access-Token": bob.Traffic},
		"Alice's key as tokens":                   {"X-Access-Token": w.Alice, "E2B-Traffic-Access-Token": w.Alice},
		"Alice's key":                             {"Authorization": "Bearer " + w.Alice, "X-API-Key": w.Alice},
		"the envd token with a wrong traffic one": {"X-Access-Token": alice.Access, "E2B-Traffic-Access-Token": bob.Traffic},
	} {
		if code, body := post(sb.ID, hdr); code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", what, code, body)
		}
	}
	// Alice's tokens are no credential of Bob's sandbox.
	if code, body := post(bobs.ID, map[string]string{"X-Access-Token": alice.Access, "E2B-Traffic-Access-Token": alice.Traffic}); code != http.StatusUnauthorized {
		t.Errorf("Alice's tokens for Bob's sandbox: %d %s, want 401", code, body)
	}
	if seen := mustExec(t, ctx, sb, "cat /tmp/seen 2>/dev/null || true"); seen != "" {
		t.Fatalf("refused requests reached the guest:\n%s", seen)
	}

	// Let in, with every credential the server knows: none reaches the
	// guest; the guest's own headers do.
	for _, hdr := range []map[string]string{
		{"X-Access-Token": alice.Access, "E2B-Traffic-Access-Token": alice.Traffic,
			"Authorization": "Bearer " + w.Alice, "X-API-Key": w.Alice, "X-Theirs": "kept"},
		{"E2B-Traffic-Access-Token": alice.Traffic, "X-Theirs": "kept"},
	} {
		if code, body := post(sb.ID, hdr); code != http.StatusOK || !strings.Contains(body, "QUERY_STRING=a=1") {
			t.Fatalf("with Alice's sandbox's tokens: %d %s, want the recorder's 200", code, body)
		}
	}
	seen := mustExec(t, ctx, sb, "cat /tmp/seen")
	t.Logf("the guest saw:\n%s", seen)
	for what, s := range map[string]string{"the API key": w.Alice, "the access token": alice.Access, "the traffic token": alice.Traffic} {
		if strings.Contains(seen, s) {
			t.Errorf("%s reached the guest", what)
		}
	}
	if got := strings.Count(seen, "---\n"); got != 2 {
		t.Errorf("the guest got %d requests, want the 2 let in", got)
	}
	if got := strings.Count(seen, "HTTP_X_THEIRS=kept\n"); got != 2 {
		t.Errorf("the client's own header reached the guest %d times of 2", got)
	}
}
