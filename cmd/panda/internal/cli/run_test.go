package cli

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunPrintsSavesAndExits: panda run prints output and text results as
// they come, saves images as cell-N-K files and prints their paths, and an
// exception goes to stderr with its traceback and exit status 1.
func TestRunPrintsSavesAndExits(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		if strings.Contains(body, "raise") {
			io.WriteString(w, `{"type":"stdout","text":"before\n"}`+"\n"+
				`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback (most recent call last):\n  1/0\nZeroDivisionError: division by zero"}`+"\n"+
				`{"type":"end","execution_count":4,"context_id":"python","duration_ms":1,"truncated":false}`+"\n")
			return
		}
		io.WriteString(w, `{"type":"stdout","text":"out\n"}`+"\n"+
			`{"type":"stderr","text":"warn\n"}`+"\n"+
			`{"type":"result","is_main_result":false,"data":{"image/png":"iVBORw0KGgo=","text/plain":"<Figure>"}}`+"\n"+
			`{"type":"result","is_main_result":false,"data":{"image/svg+xml":"<svg/>"}}`+"\n"+
			`{"type":"result","is_main_result":true,"data":{"text/plain":"42"}}`+"\n"+
			`{"type":"end","execution_count":3,"context_id":"python","duration_ms":1,"truncated":false}`+"\n")
	})
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "imgs")
	r := runCLI(ctx, "", "run", "--api-url", f.url, "--api-key", "k", "abc", "-c", "plot()", "--images-dir", dir, "--timeout", "90s")
	png, svg := filepath.Join(dir, "cell-3-1.png"), filepath.Join(dir, "cell-3-2.svg")
	if r.err != nil || r.stdout != "out\n42\n"+png+"\n"+svg+"\n" || r.stderr != "warn\n" {
		t.Errorf("got stdout %q stderr %q err %v", r.stdout, r.stderr, r.err)
	}
	if b, err := os.ReadFile(png); err != nil || string(b) != "\x89PNG\r\n\x1a\n" {
		t.Errorf("the PNG file: %q, %v", b, err)
	}
	if b, err := os.ReadFile(svg); err != nil || string(b) != "<svg/>" {
		t.Errorf("the SVG file: %q, %v", b, err)
	}

	r = runCLI(ctx, "", "run", "--api-url", f.url, "--api-key", "k", "abc", "-c", "raise", "--images-dir", dir)
	if r.exitCode() != 1 || r.stdout != "before\n" || !strings.HasSuffix(r.stderr, "ZeroDivisionError: division by zero\n") || !strings.HasPrefix(r.stderr, "Traceback") {
		t.Errorf("an exception: got exit %d stdout %q stderr %q", r.exitCode(), r.stdout, r.stderr)
	}

	file := filepath.Join(t.TempDir(), "x.sh")
	os.WriteFile(file, []byte("echo hi"), 0o644)
	// Every run saves its images in dir, never in the working directory
	// (the package's directory, when tests run).
	runCLI(ctx, "", "run", "--api-url", f.url, "--api-key", "k", "abc", file, "--images-dir", dir)
	runCLI(ctx, "print(1)", "run", "--api-url", f.url, "--api-key", "k", "abc", "--context", "c1", "--timeout", "2", "--images-dir", dir, "-")
	want := []string{
		`POST /v1/sandboxes/abc/code {"code":"plot()","timeout_seconds":90} Bearer k`,
		`POST /v1/sandboxes/abc/code {"code":"raise"} Bearer k`,
		`POST /v1/sandboxes/abc/code {"code":"echo hi","language":"bash"} Bearer k`,
		`POST /v1/sandboxes/abc/code {"code":"print(1)","context_id":"c1","timeout_seconds":2} Bearer k`,
	}
	for i := range want {
		if i >= len(f.reqs) || f.reqs[i] != want[i] {
			t.Errorf("request %d: got %q, want %q", i, f.reqs[min(i, len(f.reqs)-1)], want[i])
		}
	}

	r = runCLI(ctx, "", "run", "--api-url", f.url, "--api-key", "k", "--json", "abc", "-c", "x", "--images-dir", dir)
	var ex struct {
		Results []struct {
			Data map[string]any `json:"data"`
		} `json:"results"`
		Stdout         string `json:"stdout"`
		ExecutionCount int    `json:"execution_count"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &ex); err != nil || len(ex.Results) != 3 || ex.Stdout != "out\n" || ex.ExecutionCount != 3 ||
		ex.Results[0].Data["image/png"] != "iVBORw0KGgo=" {
		t.Errorf("--json: got %s (%v)", r.stdout, err)
	}
}

func TestRunArgumentErrors(t *testing.T) {
	isolateEnv(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "abc"}, "no code"},
		{[]string{"run", "abc", "f.py", "-c", "1"}, "not both"},
		{[]string{"run", "abc", "-c", "1", "--timeout", "soon"}, "want seconds or a duration"},
		{[]string{"run", "abc", "-c", "1", "--timeout", "2h"}, "want 1s to 1h"},
		{[]string{"run", "abc", "/nonexistent/x.py"}, "read the code"},
	} {
		if r := runCLI(context.Background(), "", tt.args...); r.err == nil || !strings.Contains(r.err.Error(), tt.want) {
			t.Errorf("%q: got %v, want %q", tt.args, r.err, tt.want)
		}
	}
}
