package e2b

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// tokenBackend is a Backend whose one key ("key_a", secret "secret-a")
// owns one volume, vol_a: enough for the content routes' authentication.
// Its other Backend methods are the nil interface's (never called here).
type tokenBackend struct {
	Backend
}

var errNoVolume = errors.New("no such volume")

func (tokenBackend) Authenticate(_ context.Context, secret string) (string, error) {
	if secret == "secret-a" {
		return "key_a", nil
	}
	return "", errStatus(http.StatusUnauthorized, "unknown API key")
}
func (tokenBackend) Status(err error) (int, string) {
	if errors.Is(err, errNoVolume) {
		return http.StatusNotFound, err.Error()
	}
	return http.StatusInternalServerError, err.Error()
}
func (tokenBackend) MaxUploadBytes() int64 { return 1 << 20 }

func (b tokenBackend) own(keyID, id string) error {
	if keyID == "key_a" && id == "vol_a" {
		return nil
	}
	return errNoVolume
}
func (b tokenBackend) CreateVolume(context.Context, string, string) (Volume, error) {
	return Volume{}, errNoVolume
}
func (b tokenBackend) Volume(_ context.Context, keyID, id string) (Volume, error) {
	return Volume{ID: id, Name: "a"}, b.own(keyID, id)
}
func (b tokenBackend) ListVolumes(context.Context, string) ([]Volume, error) { return nil, nil }
func (b tokenBackend) DeleteVolume(_ context.Context, keyID, id string) error {
	return b.own(keyID, id)
}
func (b tokenBackend) ListVolumeDir(_ context.Context, keyID, id, _ string) ([]guestproto.FileInfo, error) {
	return nil, b.own(keyID, id)
}
func (b tokenBackend) StatVolumeFile(_ context.Context, keyID, id, p string) (guestproto.FileInfo, error) {
	return guestproto.FileInfo{Name: "x", Path: p, IsDir: true}, b.own(keyID, id)
}
func (b tokenBackend) ReadVolumeFile(_ context.Context, keyID, id, _ string) (io.ReadCloser, guestproto.FileInfo, error) {
	return io.NopCloser(strings.NewReader("")), guestproto.FileInfo{}, b.own(keyID, id)
}
func (b tokenBackend) WriteVolumeFile(_ context.Context, keyID, id, _ string, _ io.Reader, _ uint32) error {
	return b.own(keyID, id)
}
func (b tokenBackend) MkdirVolume(_ context.Context, keyID, id, _ string) error {
	return b.own(keyID, id)
}
func (b tokenBackend) RemoveVolumeFile(_ context.Context, keyID, id, _ string) error {
	return b.own(keyID, id)
}

// A volume's token opens its content routes and no other volume's; a
// forged one opens nothing; an API key works as the key's.
func TestVolumeTokens(t *testing.T) {
	s, err := New(tokenBackend{}, []byte("0123456789abcdef"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := New(tokenBackend{}, []byte("fedcba9876543210"), "", nil)
	srv := httptest.NewServer(s.Intercept(http.NotFoundHandler()))
	defer srv.Close()
	tok := s.VolumeToken("key_a", "vol_a")
	if tok == s.VolumeToken("key_a", "vol_b") || tok == s.VolumeToken("key_b", "vol_a") || !strings.HasPrefix(tok, "key_a.") {
		t.Fatalf("tokens are not distinct per key and volume: %s", tok)
	}
	for _, tc := range []struct {
		name, vol, auth string
		want            int
	}{
		{"its token", "vol_a", "Bearer " + tok, 200},
		{"another volume", "vol_b", "Bearer " + tok, 401},
		{"another key's token", "vol_a", "Bearer " + s.VolumeToken("key_b", "vol_a"), 404},
		{"another server's token", "vol_a", "Bearer " + other.VolumeToken("key_a", "vol_a"), 401},
		{"a truncated token", "vol_a", "Bearer " + tok[:len(tok)-1], 401},
		{"no token", "vol_a", "", 401},
		{"the API key", "vol_a", "Bearer secret-a", 200},
		{"a bad API key", "vol_a", "Bearer secret-b", 401},
	} {
		req, _ := http.NewRequest("GET", srv.URL+"/volumecontent/"+tc.vol+"/path?path=/", nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, res.StatusCode, tc.want)
		}
	}
	// Bad input of the content routes is 400, never a crash.
	for _, u := range []string{"/volumecontent/vol_a/path", "/volumecontent/vol_a/dir?path=/&depth=99", "/volumecontent/vol_a/dir?path=/&depth=x"} {
		req, _ := http.NewRequest("GET", srv.URL+u, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 400 {
			t.Errorf("GET %s: %d, want 400", u, res.StatusCode)
		}
	}
}
