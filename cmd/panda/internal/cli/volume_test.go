package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// volumeJSON is a volume as the fake API answers it.
const volumeJSON = `{"id":"vol_0123456789abcdef","name":"data","size_mib":1024,"used_bytes":1048576,"created_at":"2026-12-07T10:00:00Z","parent":"base","mounted_by":["abc"]}`

// TestVolumeRequests: each volume verb and flag reaches the API as the
// request docs/volumes.md documents.
func TestVolumeRequests(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/v1/volumes" && r.Method == http.MethodGet:
			io.WriteString(w, `{"volumes":[`+volumeJSON+`]}`)
		case strings.HasSuffix(r.URL.Path, "/files/list"):
			io.WriteString(w, `{"entries":[{"name":"a.txt","path":"/a.txt","size":5,"mode":420,"is_dir":false}]}`)
		case strings.HasSuffix(r.URL.Path, "/files") && r.Method == http.MethodGet:
			io.WriteString(w, "hello")
		case strings.HasSuffix(r.URL.Path, "/files"):
			io.WriteString(w, `{"name":"a.txt","path":"/a.txt","size":5,"mode":420,"is_dir":false}`)
		case strings.HasSuffix(r.URL.Path, "/fork"):
			io.WriteString(w, `{"children":[{"sandbox":{"id":"c1","state":"running"}}]}`)
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes"):
			io.WriteString(w, `{"id":"abc","state":"running"}`)
		default:
			io.WriteString(w, volumeJSON)
		}
	})
	tests := []struct {
		args []string
		req  string
	}{
		{[]string{"volume", "create", "data"}, `POST /v1/volumes {"name":"data","size_mib":1024}`},
		{[]string{"volume", "create", "data", "--size", "64"}, `POST /v1/volumes {"name":"data","size_mib":64}`},
		{[]string{"volume", "ls"}, `GET /v1/volumes `},
		{[]string{"volume", "info", "data"}, `GET /v1/volumes/data `},
		{[]string{"volume", "resize", "data", "--size", "2048"}, `PATCH /v1/volumes/data {"size_mib":2048}`},
		{[]string{"volume", "rm", "data"}, `DELETE /v1/volumes/data `},
		{[]string{"volume", "rm", "data", "--force"}, `DELETE /v1/volumes/data?force=true `},
		{[]string{"volume", "promote", "data-c1"}, `POST /v1/volumes/data-c1/promote `},
		{[]string{"volume", "put", "data", "-", "/a.txt"}, `PUT /v1/volumes/data/files?path=%2Fa.txt hello`},
		{[]string{"volume", "get", "data", "/a.txt", "-"}, `GET /v1/volumes/data/files?path=%2Fa.txt `},
		{[]string{"volume", "ls-files", "data"}, `GET /v1/volumes/data/files/list?path=%2F `},
		{[]string{"volume", "ls-files", "data", "sub"}, `GET /v1/volumes/data/files/list?path=sub `},
		{[]string{"create", "--volume", "data:/mnt/data", "--volume", "refs:/mnt/refs:ro"},
			`POST /v1/sandboxes?progress=1 {"volumes":[{"name":"data","path":"/mnt/data"},{"name":"refs","path":"/mnt/refs","read_only":true}]}`},
		{[]string{"fork", "abc", "--volumes", "branch"}, `POST /v1/sandboxes/abc/fork {"count":1,"volume_mode":"branch"}`},
		{[]string{"fork", "abc", "--volumes", "share"}, `POST /v1/sandboxes/abc/fork {"count":1,"volume_mode":"share"}`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			f.reqs = nil
			r := runCLI(context.Background(), "hello", append(tt.args, "--api-url", f.url, "--api-key", "k")...)
			if r.err != nil {
				t.Fatalf("%v\nstderr: %s", r.err, r.stderr)
			}
			if want := tt.req + " Bearer k"; len(f.reqs) != 1 || f.reqs[0] != want {
				t.Errorf("got requests %q, want %q", f.reqs, want)
			}
		})
	}
}

// TestVolumeOutputs: the human forms of ls, info and get, and a mounted
// sandbox's get.
func TestVolumeOutputs(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		switch {
		case r.URL.Path == "/v1/volumes":
			io.WriteString(w, `{"volumes":[`+volumeJSON+`]}`)
		case strings.HasSuffix(r.URL.Path, "/files"):
			io.WriteString(w, "hello")
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes"):
			io.WriteString(w, `{"id":"abc","state":"running","volumes":[{"name":"data","path":"/mnt/data"},{"name":"refs","path":"/mnt/refs","read_only":true}]}`)
		default:
			io.WriteString(w, volumeJSON)
		}
	})
	flags := []string{"--api-url", f.url, "--api-key", "k"}
	r := runCLI(context.Background(), "", append([]string{"volume", "ls"}, flags...)...)
	for _, want := range []string{"NAME", "USED", "data", "1024 MiB", "1.0 MiB", "abc", "base"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("volume ls: got %q, want %q in it", r.stdout, want)
		}
	}
	r = runCLI(context.Background(), "", append([]string{"volume", "info", "data"}, flags...)...)
	for _, want := range []string{"vol_0123456789abcdef", "1.0 MiB (0.1%)", "branched from:  base", "mounted by:     abc"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("volume info: got %q, want %q in it", r.stdout, want)
		}
	}
	r = runCLI(context.Background(), "", append([]string{"get", "abc"}, flags...)...)
	if !strings.Contains(r.stdout, "data:/mnt/data") || !strings.Contains(r.stdout, "refs:/mnt/refs:ro") {
		t.Errorf("get: got %q, want the mounts", r.stdout)
	}
	dir := t.TempDir()
	r = runCLI(context.Background(), "", append([]string{"volume", "get", "data", "/x/a.txt", dir}, flags...)...)
	if b, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil || string(b) != "hello" {
		t.Errorf("volume get: got %q %v (%v)", b, err, r.err)
	}
}

// TestVolumeArgumentErrors: what is refused before any request.
func TestVolumeArgumentErrors(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		t.Errorf("unexpected request %s %s", r.Method, r.URL)
	})
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "create"}, "wrong number of arguments"},
		{[]string{"volume", "create", "d", "--size", "0"}, "--size must be at least 1"},
		{[]string{"volume", "resize", "d"}, "--size is required"},
		{[]string{"volume", "resize", "d", "--size", "-1"}, "--size must be at least 1"},
		{[]string{"volume", "put", "d", "/nonexistent/file", "/a"}, "no such file"},
		{[]string{"volume", "frobnicate"}, "unknown command"},
		{[]string{"create", "--volume", "data"}, "want NAME:/PATH"},
		{[]string{"create", "--volume", ":/mnt"}, "want NAME:/PATH"},
		{[]string{"create", "--volume", "data:mnt"}, "want NAME:/PATH"},
		{[]string{"create", "--volume", "data:/mnt:rx"}, "must be ro or rw"},
		{[]string{"create", "--volume", "data:/mnt/../etc"}, "not clean"},
		{[]string{"fork", "abc", "--volumes", "copy"}, "--volumes must be share or branch"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(context.Background(), "", append(tt.args, "--api-url", f.url, "--api-key", "k")...)
			if r.err == nil || !strings.Contains(r.err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", r.err, tt.want)
			}
		})
	}
}
