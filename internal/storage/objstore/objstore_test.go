package objstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
)

// backends gives each test a fresh, empty store of every kind.
var backends = []struct {
	name string
	open func(t *testing.T) objstore.Store
}{
	{"dir", func(t *testing.T) objstore.Store {
		s, err := objstore.OpenDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
	{"s3", func(t *testing.T) objstore.Store { return s3test.Start(t).Open("pfx") }},
}

func forEachBackend(t *testing.T, f func(t *testing.T, s objstore.Store)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { f(t, b.open(t)) })
	}
}

func randBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func put(t *testing.T, s objstore.Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func get(t *testing.T, s objstore.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return b
}

func listKeys(t *testing.T, s objstore.Store, prefix string) []string {
	t.Helper()
	var keys []string
	for in, err := range s.List(context.Background(), prefix) {
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		keys = append(keys, in.Key)
	}
	return keys
}

// The store contract (objstore.Store's doc), for every backend.
func TestConformance(t *testing.T) {
	forEachBackend(t, func(t *testing.T, s objstore.Store) {
		ctx := context.Background()
		big := randBytes(5<<20+123, 1)

		t.Run("put get stat", func(t *testing.T) {
			put(t, s, "a/big", big)
			if got := get(t, s, "a/big"); !bytes.Equal(got, big) {
				t.Errorf("Get returned %d bytes, not the %d put", len(got), len(big))
			}
			in, err := s.Stat(ctx, "a/big")
			if err != nil || in.Size != int64(len(big)) || in.Key != "a/big" {
				t.Errorf("Stat = %+v, %v; want size %d", in, err, len(big))
			}
			if d := time.Since(in.ModTime); d < -time.Minute || d > time.Minute {
				t.Errorf("Stat ModTime = %v, %v from now", in.ModTime, d)
			}
			if ok, err := objstore.Exists(ctx, s, "a/big"); !ok || err != nil {
				t.Errorf("Exists = %v, %v; want true", ok, err)
			}
		})
		t.Run("empty object", func(t *testing.T) {
			put(t, s, "a/empty", nil)
			if got := get(t, s, "a/empty"); len(got) != 0 {
				t.Errorf("Get of an empty object = %d bytes", len(got))
			}
		})
		t.Run("replace", func(t *testing.T) {
			put(t, s, "a/r", []byte("one"))
			put(t, s, "a/r", []byte("second"))
			if got := string(get(t, s, "a/r")); got != "second" {
				t.Errorf("Get after replace = %q, want %q", got, "second")
			}
		})
		t.Run("ranged get", func(t *testing.T) {
			for _, tt := range []struct {
				off, n int64
				want   []byte
			}{
				{0, 10, big[:10]},
				{3 << 20, 2 << 20, big[3<<20 : 5<<20]},
				{int64(len(big)) - 5, 100, big[len(big)-5:]}, // short at the end
				{int64(len(big)) - 1, 1, big[len(big)-1:]},
			} {
				rc, err := s.GetRange(ctx, "a/big", tt.off, tt.n)
				if err != nil {
					t.Fatalf("GetRange(%d, %d): %v", tt.off, tt.n, err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(got, tt.want) {
					t.Errorf("GetRange(%d, %d) = %d bytes, %v; want %d bytes", tt.off, tt.n, len(got), err, len(tt.want))
				}
			}
			for _, r := range [][2]int64{{int64(len(big)), 1}, {int64(len(big)) + 10, 5}, {-1, 5}, {0, 0}} {
				rc, err := s.GetRange(ctx, "a/big", r[0], r[1])
				if err == nil {
					rc.Close()
				}
				if !errors.Is(err, objstore.ErrInvalidRange) {
					t.Errorf("GetRange(%d, %d) = %v, want ErrInvalidRange", r[0], r[1], err)
				}
			}
		})
		t.Run("not found", func(t *testing.T) {
			if _, err := s.Get(ctx, "a/missing"); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("Get = %v, want ErrNotFound", err)
			}
			if _, err := s.GetRange(ctx, "a/missing", 0, 1); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("GetRange = %v, want ErrNotFound", err)
			}
			if _, err := s.Stat(ctx, "a/missing"); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("Stat = %v, want ErrNotFound", err)
			}
			if _, err := s.Get(ctx, "a"); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("Get of a prefix = %v, want ErrNotFound", err)
			}
			if ok, err := objstore.Exists(ctx, s, "a/missing"); ok || err != nil {
				t.Errorf("Exists = %v, %v; want false, nil", ok, err)
			}
			if _, err := s.Get(ctx, "a/missing"); errors.Is(err, objstore.ErrUnavailable) {
				t.Errorf("not found is also unavailable: %v", err)
			}
		})
		t.Run("delete", func(t *testing.T) {
			put(t, s, "d/x", []byte("x"))
			if err := s.Delete(ctx, "d/x"); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Stat(ctx, "d/x"); !errors.Is(err, objstore.ErrNotFound) {
				t.Errorf("Stat after Delete = %v, want ErrNotFound", err)
			}
			if err := s.Delete(ctx, "d/x"); err != nil {
				t.Errorf("second Delete = %v, want nil", err)
			}
			if err := s.Delete(ctx, "never/was"); err != nil {
				t.Errorf("Delete of a missing key = %v, want nil", err)
			}
		})
		t.Run("list", func(t *testing.T) {
			for _, k := range []string{"l/b/2", "l/a", "l/b/1", "l-c", "l/bb", "m/x"} {
				put(t, s, k, []byte(k))
			}
			for _, tt := range []struct {
				prefix string
				want   string
			}{
				{"l/", "l/a l/b/1 l/b/2 l/bb"},
				{"l/b", "l/b/1 l/b/2 l/bb"},
				{"l/b/", "l/b/1 l/b/2"},
				{"l", "l-c l/a l/b/1 l/b/2 l/bb"},
				{"nothing/", ""},
				{"m/x", "m/x"},
			} {
				if got := strings.Join(listKeys(t, s, tt.prefix), " "); got != tt.want {
					t.Errorf("List(%q) = %q, want %q", tt.prefix, got, tt.want)
				}
			}
			var sizes []int64
			for in, err := range s.List(ctx, "l/b/") {
				if err != nil {
					t.Fatal(err)
				}
				sizes = append(sizes, in.Size)
				break // stopping early must not hang or leak
			}
			if len(sizes) != 1 || sizes[0] != int64(len("l/b/1")) {
				t.Errorf("first of List(l/b/) has size %v, want [%d]", sizes, len("l/b/1"))
			}
			all := listKeys(t, s, "")
			if len(all) < 6 {
				t.Errorf("List(\"\") = %v, want every key", all)
			}
		})
		t.Run("reader size mismatch stores nothing", func(t *testing.T) {
			if err := s.Put(ctx, "w/short", bytes.NewReader([]byte("abc")), 10); err == nil {
				t.Errorf("Put of 3 bytes with size 10 succeeded")
			}
			if err := s.Put(ctx, "w/long", bytes.NewReader([]byte("abcdef")), 3); err == nil {
				t.Errorf("Put of 6 bytes with size 3 succeeded")
			}
			if err := s.Put(ctx, "w/failing", io.MultiReader(bytes.NewReader([]byte("ab")), errReader{}), 10); err == nil {
				t.Errorf("Put from a failing reader succeeded")
			}
			if got := listKeys(t, s, "w/"); len(got) != 0 {
				t.Errorf("after failed Puts, List(w/) = %v, want none", got)
			}
		})
		t.Run("create only where there is none", func(t *testing.T) {
			c, ok := s.(objstore.Creator)
			if !ok {
				t.Fatalf("%T is no Creator", s)
			}
			if err := c.Create(ctx, "c/one", bytes.NewReader([]byte("first")), 5); err != nil {
				t.Fatalf("Create of a new key: %v", err)
			}
			if err := c.Create(ctx, "c/one", bytes.NewReader([]byte("second")), 6); !errors.Is(err, objstore.ErrExists) {
				t.Errorf("Create of a taken key = %v, want ErrExists", err)
			}
			if got := get(t, s, "c/one"); string(got) != "first" {
				t.Errorf("after a refused Create the object holds %q, want the first", got)
			}
			if err := c.Create(ctx, "c/short", bytes.NewReader([]byte("ab")), 3); err == nil {
				t.Errorf("Create of 2 bytes with size 3 succeeded")
			}
			// Of many hosts creating one key at once, exactly one wins
			// and the object is the winner's.
			const n = 8
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					errs[i] = c.Create(ctx, "c/race", bytes.NewReader([]byte{byte('a' + i)}), 1)
				})
			}
			wg.Wait()
			won := -1
			for i, err := range errs {
				switch {
				case err == nil && won >= 0:
					t.Errorf("Create by %d and by %d both succeeded", won, i)
				case err == nil:
					won = i
				case !errors.Is(err, objstore.ErrExists):
					t.Errorf("Create by %d: %v, want nil or ErrExists", i, err)
				}
			}
			if won < 0 {
				t.Fatalf("no Create succeeded: %v", errs)
			}
			if got := get(t, s, "c/race"); string(got) != string(rune('a'+won)) {
				t.Errorf("c/race holds %q, want the winner's %q", got, string(rune('a'+won)))
			}
			if got := listKeys(t, s, "c/"); !slices.Equal(got, []string{"c/one", "c/race"}) {
				t.Errorf("List(c/) = %v, want c/one and c/race only", got)
			}
		})
		t.Run("invalid keys", func(t *testing.T) {
			for _, k := range []string{"", "/abs", "a/../b", "..", "a//b", "a/", ".hidden", "a/.tmp/x", "a\\b", "a\x00b", strings.Repeat("k", 600)} {
				if err := s.Put(ctx, k, bytes.NewReader(nil), 0); !errors.Is(err, objstore.ErrInvalidKey) {
					t.Errorf("Put(%q) = %v, want ErrInvalidKey", k, err)
				}
				if _, err := s.Get(ctx, k); !errors.Is(err, objstore.ErrInvalidKey) {
					t.Errorf("Get(%q) = %v, want ErrInvalidKey", k, err)
				}
			}
			for _, err := range s.List(ctx, "../") {
				if !errors.Is(err, objstore.ErrInvalidKey) {
					t.Errorf("List(../) = %v, want ErrInvalidKey", err)
				}
			}
		})
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

// A directory store keeps no temporary file after a failed Put and never
// shows a temporary file as an object.
func TestDirTempFiles(t *testing.T) {
	s, err := objstore.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.Put(ctx, "x", io.MultiReader(bytes.NewReader([]byte("ab")), errReader{}), 10)
	put(t, s, "y", []byte("y"))
	ents, err := os.ReadDir(filepath.Join(s.Root(), ".tmp"))
	if err != nil || len(ents) != 0 {
		t.Errorf(".tmp holds %d entries (%v), want 0", len(ents), err)
	}
	os.WriteFile(filepath.Join(s.Root(), ".tmp", "put-123"), []byte("partial"), 0o600)
	if got := listKeys(t, s, ""); strings.Join(got, " ") != "y" {
		t.Errorf("List = %v, want [y]", got)
	}
}

// A server that is down is ErrUnavailable (not ErrNotFound) for every
// operation; once it is back, what was stored before is all there.
func TestS3Unavailable(t *testing.T) {
	srv := s3test.Start(t)
	s := srv.Open("down")
	ctx := context.Background()
	data := randBytes(1<<20, 2)
	put(t, s, "k", data)

	srv.Stop()
	_, err := s.Get(ctx, "k")
	if !errors.Is(err, objstore.ErrUnavailable) || errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("Get with the server down = %v, want ErrUnavailable", err)
	}
	if _, err := s.Stat(ctx, "missing"); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Stat with the server down = %v, want ErrUnavailable", err)
	}
	if ok, err := objstore.Exists(ctx, s, "k"); ok || !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Exists with the server down = %v, %v; want ErrUnavailable", ok, err)
	}
	if err := s.Put(ctx, "k2", bytes.NewReader(data), int64(len(data))); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Put with the server down = %v, want ErrUnavailable", err)
	}
	if err := s.Delete(ctx, "k"); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Delete with the server down = %v, want ErrUnavailable", err)
	}
	for _, err := range s.List(ctx, "") {
		if !errors.Is(err, objstore.ErrUnavailable) {
			t.Errorf("List with the server down = %v, want ErrUnavailable", err)
		}
	}

	srv.Restart()
	if got := get(t, s, "k"); !bytes.Equal(got, data) {
		t.Errorf("after restart Get = %d bytes, want the %d put before", len(got), len(data))
	}
	put(t, s, "k2", data)
	if got := strings.Join(listKeys(t, s, ""), " "); got != "k k2" {
		t.Errorf("after restart List = %q, want %q", got, "k k2")
	}
}

// A missing bucket is the store being unusable, not a missing object.
func TestS3NoBucket(t *testing.T) {
	srv := s3test.Start(t)
	s, err := objstore.Open("s3://no-such-bucket/p?insecure=1&retries=1&endpoint="+srv.Addr, srv.Credentials())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "k"); !errors.Is(err, objstore.ErrUnavailable) {
		t.Errorf("Get from a missing bucket = %v, want ErrUnavailable", err)
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	creds := objstore.Credentials{AccessKey: "a", SecretKey: "s"}
	for _, tt := range []struct {
		url     string
		want    string // String() of the store, or
		wantErr string // a part of the error
	}{
		{dir + "/plain", "file://" + dir + "/plain", ""},
		{"file://" + dir + "/f", "file://" + dir + "/f", ""},
		{"s3://bucket/some/prefix?endpoint=127.0.0.1:9000&insecure=1&region=eu-west-1&retries=3", "s3://bucket/some/prefix?endpoint=127.0.0.1:9000", ""},
		{"s3://bucket", "s3://bucket", ""},
		{"", "", "--store \"\": empty"},
		{"file://host/x", "", "--store file://host/x: file URL with host"},
		{"ftp://x/y", "", `--store ftp://x/y: unknown scheme "ftp"`},
		{"s3:///prefix", "", "--store s3:///prefix: no bucket"},
		{"s3://Bad_Bucket/p", "", "bucket \"Bad_Bucket\""},
		{"s3://bucket/a/../b", "", "prefix \"a/../b\""},
		{"s3://bucket/p?endpoint=http://h:1", "", "endpoint \"http://h:1\": want host:port"},
		{"s3://bucket/p?insecure=maybe", "", "insecure \"maybe\""},
		{"s3://bucket/p?retries=0", "", "retries \"0\""},
		{"s3://bucket/p?endpont=h:1", "", `unknown parameter "endpont"`},
		{"s3://bucket/p?region=a&region=b", "", "region given 2 times"},
		{"s3://key:secret@bucket/p", "", "--store s3://key:xxxxx@bucket/p: credentials in the URL"},
	} {
		s, err := objstore.Open(tt.url, creds)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("Open(%q) = %v, want an error with %q", tt.url, err, tt.wantErr)
		case tt.wantErr == "" && err != nil:
			t.Errorf("Open(%q): %v", tt.url, err)
		case tt.wantErr == "" && s.String() != tt.want:
			t.Errorf("Open(%q) = %s, want %s", tt.url, s, tt.want)
		}
	}
	if _, err := objstore.Open("s3://bucket/p", objstore.Credentials{}); err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
		t.Errorf("Open without credentials = %v, want an error naming AWS_ACCESS_KEY_ID", err)
	}
	env := map[string]string{"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "sec"}
	if got := objstore.EnvCredentials(func(k string) string { return env[k] }); got.AccessKey != "id" || got.SecretKey != "sec" {
		t.Errorf("EnvCredentials = %+v", got)
	}
}
