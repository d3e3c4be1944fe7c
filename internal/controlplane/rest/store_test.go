package rest_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// storeServer is an API server of its own whose host agent keeps
// snapshots in cs (through the host API with PANDA_TEST_HOST=remote, as
// the package's server does); everything is closed and removed when t
// ends.
func storeServer(t *testing.T, cs *chunkstore.Store) (url, key string, ag *hostagent.Agent) {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "pst") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	drv, err := qemu.New(qemu.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ag, err = hostagent.Open(ctx, hostagent.Config{
		DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30, Driver: drv,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256, Store: cs, StoreRetry: 100 * time.Millisecond, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	var h host.Host = hostagent.Local(ag)
	if os.Getenv("PANDA_TEST_HOST") == "remote" {
		hsrv := hostapi.NewServer(ag, "store-token", log)
		hh := httptest.NewServer(hsrv)
		c, err := hostclient.Dial(hh.URL, "store-token", hostclient.WithLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); hsrv.Close(); hh.Close() })
		h = c
	}
	cat, err := sqlite.Open(ctx, filepath.Join(dir, "panda.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	srv, cp, err := newServer(rest.Config{OpenAPI: []byte("openapi: 3.0.3\n"), Logger: log}, controlplane.Config{}, cat, h)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown()
		cp.Shutdown(ctx)
		hs.Close()
	})
	_, key, err = rest.NewKey(ctx, cat, "store", true, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	return hs.URL, key, ag
}

type snapshotState struct {
	ID         string `json:"id"`
	Stored     string `json:"stored"`
	StoreError string `json:"store_error"`
}

// TestSnapshotStoreAPI: through the REST API, with a host agent keeping
// snapshots in a real S3 server: a snapshot's "stored" goes from
// uploading to durable; a create from a snapshot whose files the host
// lost restores it from the store; with the store down that create is
// 503 unavailable and a new snapshot shows the upload error, until the
// store is back; a delete removes the snapshot from the store.
func TestSnapshotStoreAPI(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	cs, err := chunkstore.New(s3.Open("api"), chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	url, key, ag := storeServer(t, cs)
	req := func(method, path string, body any) resp { return doAt(t, url, key, method, path, body) }
	get := func(id string) snapshotState {
		var s snapshotState
		r := req("GET", "/v1/snapshots/"+id, nil)
		expect(t, r, 200, "")
		r.json(t, &s)
		return s
	}
	waitStored := func(id, want string) {
		t.Helper()
		var s snapshotState
		testkit.WaitForf(t, time.Minute, func() string {
			return "snapshot " + id + " stored " + want + ": it is " + s.Stored + " (" + s.StoreError + ")"
		},
			func() bool { s = get(id); return s.Stored == want })
	}
	createFrom := func(snapID string) resp {
		r := req("POST", "/v1/sandboxes", map[string]any{"snapshot_id": snapID})
		if r.status == 201 {
			var sb sandbox
			r.json(t, &sb)
			t.Cleanup(func() { req("DELETE", "/v1/sandboxes/"+sb.ID, nil) })
		}
		return r
	}
	cat := func(id string) string {
		r := req("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"cmd": "cat /root/d.txt"})
		expect(t, r, 200, "")
		var x execRes
		r.json(t, &x)
		return x.Stdout
	}

	r := req("POST", "/v1/sandboxes", map[string]any{})
	expect(t, r, 201, "")
	var src sandbox
	r.json(t, &src)
	t.Cleanup(func() { req("DELETE", "/v1/sandboxes/"+src.ID, nil) })
	expect(t, req("POST", "/v1/sandboxes/"+src.ID+"/exec", map[string]any{"cmd": "echo durable > /root/d.txt"}), 200, "")

	r = req("POST", "/v1/sandboxes/"+src.ID+"/snapshots", map[string]any{"name": "s1"})
	expect(t, r, 201, "")
	var s1 snapshotState
	r.json(t, &s1)
	if s1.Stored != "uploading" && s1.Stored != "durable" {
		t.Errorf("new snapshot: stored %q", s1.Stored)
	}
	waitStored(s1.ID, "durable")
	var list struct{ Snapshots []snapshotState }
	req("GET", "/v1/snapshots", nil).json(t, &list)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Stored != "durable" {
		t.Errorf("list: %+v", list.Snapshots)
	}

	// The host loses the snapshot's files; a create restores it from
	// the store. With the store down, that create is 503 and loses
	// nothing.
	local := filepath.Join(ag.StoreDir(), "snapshots", s1.ID)
	if err := os.RemoveAll(local); err != nil {
		t.Fatal(err)
	}
	s3.Stop()
	r = createFrom(s1.ID)
	expect(t, r, 503, "unavailable")
	if !strings.Contains(string(r.body), "object store") || strings.Contains(string(r.body), ag.StoreDir()) {
		t.Errorf("create with the store down: %s, want a message about the object store, without host paths", r.body)
	}
	waitStored(s1.ID, "durable")
	s3.Restart()
	r = createFrom(s1.ID)
	expect(t, r, 201, "")
	var c1 sandbox
	r.json(t, &c1)
	if got := cat(c1.ID); got != "durable\n" {
		t.Errorf("restored from the store: d.txt is %q", got)
	}

	// A snapshot taken with the store down: usable, not durable, the
	// error shown; durable once the store is back.
	s3.Stop()
	r = req("POST", "/v1/sandboxes/"+src.ID+"/snapshots", nil)
	expect(t, r, 201, "")
	var s2 snapshotState
	r.json(t, &s2)
	testkit.WaitForf(t, time.Minute, func() string { return "an upload error on the snapshot taken with the store down" },
		func() bool { return get(s2.ID).StoreError != "" })
	if s := get(s2.ID); s.Stored != "uploading" {
		t.Errorf("snapshot taken with the store down: %+v", s)
	}
	expect(t, createFrom(s2.ID), 201, "")
	s3.Restart()
	waitStored(s2.ID, "durable")

	// Deletes remove the snapshots from the store.
	for _, id := range []string{s1.ID, s2.ID} {
		expect(t, req("DELETE", "/v1/snapshots/"+id, nil), 204, "")
		expect(t, req("GET", "/v1/snapshots/"+id, nil), 404, "not_found")
	}
	var names []string
	testkit.WaitForf(t, time.Minute, func() string { return fmt.Sprintf("no snapshot manifests left in the store, have %v", names) }, func() bool {
		all, err := cs.Names(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// The templates' sets stay: every host shares them.
		names = slices.DeleteFunc(all, func(n string) bool { return strings.HasPrefix(n, "templates/") })
		return len(names) == 0
	})
}
