package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/hostagent/template/rootfs"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestImageConverter pulls an image from a registry on loopback through
// the converter panda up uses: its config comes back, a missing image is
// tmplbuild.ErrImageNotFound.
func TestImageConverter(t *testing.T) {
	testkit.Root(t) // building a root filesystem
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("hi\n")
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/hello", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	tw.Write(body)
	tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, _ := mutate.AppendLayers(empty.Image, l)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"HELLO=world"}
	cf.Config.WorkingDir = "/srv"
	cf.Config.User = "app"
	img, _ = mutate.ConfigFile(img, cf)
	ref, _ := name.ParseReference(host+"/t/hello:1", name.Insecure)
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	// The registry is on loopback: refused unless the operator allows it.
	refused := imageConverter(64, &rootfs.Pull{}, slog.New(slog.DiscardHandler))
	if _, err := refused(context.Background(), host+"/t/hello:1", filepath.Join(t.TempDir(), "x.ext4"), func(string) {}); !errors.Is(err, rootfs.ErrRefused) {
		t.Errorf("a pull from loopback without an allow-list: %v, want rootfs.ErrRefused", err)
	}
	pull, err := Config{RegistryAllowNets: []string{"127.0.0.1"}}.registryPull()
	if err != nil {
		t.Fatal(err)
	}
	convert := imageConverter(64, pull, slog.New(slog.DiscardHandler))
	out := filepath.Join(t.TempDir(), "rootfs.ext4")
	var lines []string
	res, err := convert(context.Background(), host+"/t/hello:1", out, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	if res.Image.WorkingDir != "/srv" || res.Image.User != "app" || len(res.Image.Env) != 1 || !strings.HasPrefix(res.Digest, "sha256:") {
		t.Errorf("result %+v", res)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 || len(lines) == 0 {
		t.Errorf("ext4 %v, progress %q", err, lines)
	}
	_, err = convert(context.Background(), host+"/t/nothing:1", filepath.Join(t.TempDir(), "x.ext4"), func(string) {})
	if !errors.Is(err, builds.ErrImageNotFound) || strings.Contains(err.Error(), "docker://") {
		t.Errorf("missing image: %v, want ErrImageNotFound", err)
	}
}

// TestRegistryPullConfig: the registry allow-lists are checked when the
// configuration is.
func TestRegistryPullConfig(t *testing.T) {
	for _, tc := range []struct {
		nets, hosts []string
		ok          bool
	}{
		{nil, nil, true},
		{[]string{"10.0.0.0/8", "127.0.0.1", "fd00::/8"}, []string{"registry.internal", "registry.internal:5000"}, true},
		{[]string{"10.0.0.0/33"}, nil, false},
		{[]string{"registry.internal"}, nil, false},
		{nil, []string{"https://registry.internal/"}, false},
		{nil, []string{""}, false},
	} {
		c := Defaults()
		c.RegistryAllowNets, c.RegistryAllowHosts = tc.nets, tc.hosts
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("nets %q, hosts %q: Validate() = %v, want ok %v", tc.nets, tc.hosts, err, tc.ok)
		}
	}
}

// TestRunNote: Dockerfile builds say that their RUN steps have no network
// unless the build VM gets one (networking on and --bake-network).
func TestRunNote(t *testing.T) {
	for _, tc := range []struct {
		network string
		bake    bool
		want    string
	}{
		{"on", true, ""},
		{"on", false, "without --bake-network"},
		{"off", true, "with --network off"},
		{"off", false, "with --network off"},
	} {
		got := Config{Network: tc.network, BakeNetwork: tc.bake}.runNote()
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("network %s, bake network %v: note %q, want one with %q", tc.network, tc.bake, got, tc.want)
		}
	}
}
