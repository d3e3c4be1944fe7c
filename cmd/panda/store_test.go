package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// TestUpWithStore: `panda up --store s3://...` (credentials from the AWS
// variables) keeps snapshots durable in a real S3 server: a snapshot
// becomes durable; one whose files the host lost is restored from the
// store; an upload the store's outage held back completes after a restart
// of panda; a delete removes the snapshot from the store.
func TestUpWithStore(t *testing.T) {
	e2e(t)
	s3 := s3test.Start(t)
	cs, err := chunkstore.New(s3.Open("up"), chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	dataDir := newDataDir(t)
	opts := upOptions(dataDir, "", "--store", s3.URL("up"))
	opts.Env = []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}
	p := start(t, "up", opts)
	ctx := ctxFor(t)
	c := p.client(t)
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			<-tick.C
		}
	}
	stored := func(id string) pandastack.Snapshot {
		s, err := c.GetSnapshot(ctx, id)
		if err != nil {
			t.Fatalf("get snapshot %s: %v", id, err)
		}
		return s
	}

	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/d.txt", "durable\n")
	s1, err := sb.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if s1.Stored != "uploading" {
		t.Errorf("new snapshot: stored %q, want uploading", s1.Stored)
	}
	poll("snapshot 1 durable", func() bool { return stored(s1.ID).Stored == "durable" })

	// The host loses the snapshot's files: a create restores it.
	if err := os.RemoveAll(filepath.Join(dataDir, "store", "snapshots", s1.ID)); err != nil {
		t.Fatal(err)
	}
	c1, err := c.Create(ctx, pandastack.CreateOptions{SnapshotID: s1.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create from a snapshot the host lost: %v", err)
	}
	if got := mustExec(t, ctx, c1, "cat /root/d.txt"); got != "durable\n" {
		t.Errorf("restored from the store: d.txt is %q", got)
	}

	// The store is down when a snapshot is taken, and panda restarts
	// before it is back: the upload completes after the restart.
	s3.Stop()
	s2, err := sb.Snapshot(ctx, "s2")
	if err != nil {
		t.Fatalf("snapshot with the store down: %v", err)
	}
	poll("an upload error", func() bool { return stored(s2.ID).StoreError != "" })
	mustStop(t, p)
	s3.Restart()
	p = start(t, "up again", opts)
	c = p.client(t)
	poll("snapshot 2 durable after the restart", func() bool { return stored(s2.ID).Stored == "durable" })

	for _, id := range []string{s1.ID, s2.ID} {
		if err := c.DeleteSnapshot(ctx, id); err != nil {
			t.Fatalf("delete snapshot %s: %v", id, err)
		}
		poll("snapshot "+id+" gone from the store", func() bool {
			_, err := cs.Manifest(ctx, "snapshots/"+id)
			return errors.Is(err, objstore.ErrNotFound)
		})
	}
}
