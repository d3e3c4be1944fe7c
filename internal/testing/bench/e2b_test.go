package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseE2BLine(t *testing.T) {
	for _, tt := range []struct {
		line    string
		want    e2bLine
		wantErr string
	}{
		{line: `{"ready":true,"sdk_version":"2.51.0"}`, want: e2bLine{Ready: true, SDKVersion: "2.51.0"}},
		{line: `{"create_ms":250.5,"run_ms":40.25,"total_ms":290.75,"sandbox_id":"abc","memory_mib":1024}`,
			want: e2bLine{CreateMS: 250.5, RunMS: 40.25, TotalMS: 290.75, SandboxID: "abc", MemoryMiB: 1024}},
		{line: `{"error":"SandboxError: boom"}`, wantErr: "e2b SDK: SandboxError: boom"},
		{line: `{"create_ms":1}`, wantErr: "no total_ms"},
		{line: `Debugger listening`, wantErr: "bad line"},
	} {
		got, err := parseE2BLine([]byte(tt.line))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseE2BLine(%s): got error %v, want one containing %q", tt.line, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseE2BLine(%s) = %+v, %v; want %+v, nil", tt.line, got, err, tt.want)
		}
	}
}

func TestSummarizeE2B(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		var out []time.Duration
		for _, v := range vs {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	var r E2BResult
	summarizeE2B(&r, ms(330, 300, 900), ms(200, 100, 250), ms(300, 280, 310))
	if r.E2B.P50 != 330 || r.E2B.P99 != 900 || r.E2B.N != 3 {
		t.Errorf("E2B = %+v, want p50 330, p99 900, n 3", r.E2B)
	}
	if r.PandaStack.P50 != 200 || r.PandaStackLogin.P50 != 300 {
		t.Errorf("p50s = %v, %v; want 200, 300", r.PandaStack.P50, r.PandaStackLogin.P50)
	}
	if r.Ratio != 1.65 || r.RatioLogin != 1.1 {
		t.Errorf("ratios = %v, %v; want 1.65, 1.1", r.Ratio, r.RatioLogin)
	}
	var empty E2BResult
	summarizeE2B(&empty, nil, nil, nil)
	if empty.Ratio != 0 || empty.RatioLogin != 0 {
		t.Errorf("ratios without samples = %v, %v; want 0, 0", empty.Ratio, empty.RatioLogin)
	}
}

func TestE2BMissing(t *testing.T) {
	dir := t.TempDir()
	if got := E2BMissing("", dir); !strings.Contains(got, "node is not installed") {
		t.Errorf("without node: got %q", got)
	}
	if got := E2BMissing("/usr/bin/node", dir); !strings.Contains(got, "bench.mjs not found") {
		t.Errorf("without bench.mjs: got %q", got)
	}
	os.WriteFile(filepath.Join(dir, E2BScript), nil, 0o644)
	if got := E2BMissing("/usr/bin/node", dir); !strings.Contains(got, "npm ci") {
		t.Errorf("without node_modules: got %q", got)
	}
	os.MkdirAll(filepath.Join(dir, "node_modules", "e2b"), 0o755)
	os.WriteFile(filepath.Join(dir, "node_modules", "e2b", "package.json"), []byte("{}"), 0o644)
	if got := E2BMissing("/usr/bin/node", dir); got != "" {
		t.Errorf("with everything: got %q, want \"\"", got)
	}
}
