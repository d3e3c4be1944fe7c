package pandastack

import (
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// TestVolumeRequests holds each volume call to the request the API
// documents (api/openapi.yaml, docs/volumes.md).
func TestVolumeRequests(t *testing.T) {
	type seen struct {
		method, path, query, body string
	}
	var got seen
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, canonJSON(string(b))}
		switch {
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		case r.URL.Path == "/v1/volumes" && r.Method == http.MethodGet:
			writeJSON(w, 200, map[string]any{"volumes": []any{map[string]any{"id": "vol_a", "name": "data", "size_mib": 1024, "used_bytes": 0, "created_at": "2026-12-07T10:00:00Z", "mounted_by": []string{}}}})
		case strings.HasSuffix(r.URL.Path, "/files/list"):
			writeJSON(w, 200, map[string]any{"entries": []any{map[string]any{"name": "a", "path": "/a", "size": 1, "mode": 0o644, "is_dir": false}}})
		case strings.Contains(r.URL.Path, "/files"):
			writeJSON(w, 200, map[string]any{"name": "a", "path": "/a", "size": 1, "mode": 0o644, "is_dir": false})
		case strings.HasPrefix(r.URL.Path, "/v1/sandboxes"):
			writeJSON(w, 200, map[string]any{"id": "abc", "state": "running", "created_at": "2025-01-02T03:04:05Z", "metadata": map[string]string{},
				"volumes": []any{map[string]any{"name": "data", "path": "/mnt/data", "read_only": true}}})
		default:
			writeJSON(w, 200, map[string]any{"id": "vol_a", "name": "data", "size_mib": 2048, "used_bytes": 4096, "created_at": "2026-12-07T10:00:00Z", "parent": "base", "mounted_by": []string{"abc"}})
		}
	})
	ctx := context.Background()
	files := c.VolumeFiles("data")
	tests := []struct {
		name string
		call func() error
		want seen
	}{
		{"create", func() error { _, err := c.CreateVolume(ctx, "data", 2048); return err },
			seen{"POST", "/v1/volumes", "", `{"name":"data","size_mib":2048}`}},
		{"create default size", func() error { _, err := c.CreateVolume(ctx, "data", 0); return err },
			seen{"POST", "/v1/volumes", "", `{"name":"data"}`}},
		{"list", func() error { _, err := c.Volumes(ctx); return err }, seen{"GET", "/v1/volumes", "", ``}},
		{"get", func() error { _, err := c.GetVolume(ctx, "data"); return err }, seen{"GET", "/v1/volumes/data", "", ``}},
		{"resize", func() error { _, err := c.ResizeVolume(ctx, "data", 4096); return err },
			seen{"PATCH", "/v1/volumes/data", "", `{"size_mib":4096}`}},
		{"delete", func() error { return c.DeleteVolume(ctx, "data", false) }, seen{"DELETE", "/v1/volumes/data", "", ``}},
		{"delete force", func() error { return c.DeleteVolume(ctx, "data", true) }, seen{"DELETE", "/v1/volumes/data", "force=true", ``}},
		{"promote", func() error { _, err := c.PromoteVolume(ctx, "data-abc"); return err },
			seen{"POST", "/v1/volumes/data-abc/promote", "", ``}},
		{"write", func() error { _, err := files.WriteFile(ctx, "/a b", strings.NewReader("x"), 0o600); return err },
			seen{"PUT", "/v1/volumes/data/files", "mode=600&path=%2Fa+b", `x`}},
		{"read", func() error {
			rc, err := files.ReadFile(ctx, "a")
			if err == nil {
				rc.Close()
			}
			return err
		}, seen{"GET", "/v1/volumes/data/files", "path=a", ``}},
		{"ls", func() error { _, err := files.ListFiles(ctx, "/"); return err }, seen{"GET", "/v1/volumes/data/files/list", "path=%2F", ``}},
		{"stat", func() error { _, err := files.Stat(ctx, "/a"); return err }, seen{"GET", "/v1/volumes/data/files/stat", "path=%2Fa", ``}},
		{"mkdir", func() error { _, err := files.Mkdir(ctx, "/d/e"); return err },
			seen{"POST", "/v1/volumes/data/files/mkdir", "", `{"path":"/d/e"}`}},
		{"rm -r", func() error { return files.Remove(ctx, "/d", true) }, seen{"DELETE", "/v1/volumes/data/files", "path=%2Fd&recursive=true", ``}},
		{"create sandbox with volumes", func() error {
			_, err := c.Create(ctx, CreateOptions{Template: "tiny", Volumes: []VolumeMount{{Name: "data", Path: "/mnt/data"}, {Name: "ref", Path: "/mnt/ref", ReadOnly: true}}})
			return err
		}, seen{"POST", "/v1/sandboxes", "", `{"template":"tiny","volumes":[{"name":"data","path":"/mnt/data"},{"name":"ref","path":"/mnt/ref","read_only":true}]}`}},
		{"fork branch", func() error {
			_, err := c.Sandbox("abc").ForkWithOptions(ctx, ForkOptions{VolumeMode: VolumeBranch})
			var fe *ForkError // the stub answers no children
			if errors.As(err, &fe) {
				return nil
			}
			return err
		}, seen{"POST", "/v1/sandboxes/abc/fork", "", `{"count":1,"volume_mode":"branch"}`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got = seen{}
			if err := tt.call(); err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if want.body != "x" {
				want.body = canonJSON(want.body)
			}
			if got != want {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}

	v, err := c.GetVolume(ctx, "data")
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != "vol_a" || v.SizeMiB != 2048 || v.UsedBytes != 4096 || v.Parent != "base" || !reflect.DeepEqual(v.MountedBy, []string{"abc"}) || v.CreatedAt.IsZero() {
		t.Errorf("got volume %+v", v)
	}
	sb, err := c.Get(ctx, "abc")
	if err != nil {
		t.Fatal(err)
	}
	if want := []VolumeMount{{Name: "data", Path: "/mnt/data", ReadOnly: true}}; !reflect.DeepEqual(sb.Info.Volumes, want) {
		t.Errorf("got mounts %+v, want %+v", sb.Info.Volumes, want)
	}
}

// TestVolumeLocalValidation: what is refused before anything is sent.
func TestVolumeLocalValidation(t *testing.T) {
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("unexpected request %s %s", r.Method, r.URL)
	})
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"negative size":  func() error { _, err := c.CreateVolume(ctx, "d", -1); return err },
		"resize to zero": func() error { _, err := c.ResizeVolume(ctx, "d", 0); return err },
		"empty get":      func() error { _, err := c.GetVolume(ctx, ""); return err },
		"empty delete":   func() error { return c.DeleteVolume(ctx, "", true) },
		"empty promote":  func() error { _, err := c.PromoteVolume(ctx, ""); return err },
		"empty files":    func() error { _, err := c.VolumeFiles("").Stat(ctx, "/"); return err },
		"bad volume mode": func() error {
			_, err := c.Sandbox("abc").ForkWithOptions(ctx, ForkOptions{VolumeMode: "copy"})
			return err
		},
	} {
		if err := call(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}
