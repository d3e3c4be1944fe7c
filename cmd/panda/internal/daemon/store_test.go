package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// TestStoreURLIsRefusedAtStart: a --store the agent cannot use stops the
// start with the reason, before any VMM or sandbox is touched.
func TestStoreURLIsRefusedAtStart(t *testing.T) {
	for _, tc := range []struct {
		url   string
		creds objstore.Credentials
		want  string
	}{
		{"s3://bucket/p?endpont=h:1", objstore.Credentials{AccessKey: "a", SecretKey: "b"}, `unknown parameter "endpont"`},
		{"s3://bucket/p?endpoint=h:1", objstore.Credentials{}, "AWS_ACCESS_KEY_ID"},
		{"ftp://x/y", objstore.Credentials{}, `unknown scheme "ftp"`},
	} {
		cfg := Defaults()
		cfg.DataDir, cfg.Network, cfg.Store, cfg.StoreCredentials = t.TempDir(), "off", tc.url, tc.creds
		_, _, _, err := openHost(context.Background(), cfg, slog.New(slog.DiscardHandler))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "object store") {
			t.Errorf("--store %s: %v, want an error naming %s", tc.url, err, tc.want)
		}
	}
}

// TestStoreOwner: a data directory keeps its name among the object
// store's users across restarts, and two data directories differ.
func TestStoreOwner(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	first, err := storeOwner(a)
	if err != nil || len(first) != 16 {
		t.Fatalf("storeOwner = %q, %v", first, err)
	}
	if again, err := storeOwner(a); err != nil || again != first {
		t.Errorf("storeOwner again = %q, %v; want %q", again, err, first)
	}
	if other, err := storeOwner(b); err != nil || other == first {
		t.Errorf("another data directory's owner = %q, %v; want one of its own", other, err)
	}
}
