package rest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// waitFor polls sandbox id until cond holds (at most a minute).
func waitFor(t *testing.T, key, id string, what string, cond func(sandbox) bool) sandbox {
	t.Helper()
	var sb sandbox
	testkit.WaitForf(t, time.Minute, func() string { return fmt.Sprintf("sandbox %s: %+v, want %s", id, sb, what) }, func() bool {
		sb = sandbox{}
		do(t, key, "GET", "/v1/sandboxes/"+id, nil).json(t, &sb)
		return cond(sb)
	})
	return sb
}

// startingSandbox starts a create that bakes a new shape (slow) with key
// and returns the id of the sandbox while it is still starting, and the
// create's outcome.
func startingSandbox(t *testing.T, key string, memoryMiB int) (string, <-chan resp) {
	t.Helper()
	out := make(chan resp, 1)
	go func() { out <- do(t, key, "POST", "/v1/sandboxes", map[string]any{"memory_mib": memoryMiB}) }()
	var id string
	testkit.WaitFor(t, time.Minute, "the create showing a starting sandbox", func() bool {
		var list struct{ Sandboxes []sandbox }
		do(t, key, "GET", "/v1/sandboxes?state=starting", nil).json(t, &list)
		if len(list.Sandboxes) == 1 {
			id = list.Sandboxes[0].ID
		}
		return id != ""
	})
	return id, out
}

// A kill or a key revocation that arrives while a sandbox starts (here:
// while its template shape bakes) wins: the create fails, the sandbox is
// recorded stopped, and nothing runs on the host.
func TestKillAndRevokeWinOverAStartingSandbox(t *testing.T) {
	world(t)
	for _, tc := range []struct {
		name, reason string
		memory       int
		end          func(t *testing.T, key, keyID, id string)
	}{
		{"kill", "killed", 320, func(t *testing.T, key, _, id string) {
			expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+id, nil), 204, "")
		}},
		{"revoke", "key_revoked", 352, func(t *testing.T, _, keyID, _ string) {
			expect(t, do(t, e.admin, "DELETE", "/v1/keys/"+keyID, nil), 204, "")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, keyID := newKeyWithID(t, "starting-"+tc.name, nil, true)
			id, out := startingSandbox(t, key, tc.memory)
			tc.end(t, key, keyID, id)
			r := <-out
			if r.status == 201 {
				t.Fatalf("the create succeeded after its sandbox was %s: %s", tc.reason, r.body)
			}
			if got, err := e.cat.GetSandbox(context.Background(), id); err != nil || got.State != "stopped" || got.StopReason != tc.reason {
				t.Errorf("record after the %s: %+v, %v; want stopped, %s", tc.name, got, err, tc.reason)
			}
			if _, err := e.host.Get(id); err == nil {
				t.Errorf("sandbox %s still on the host after the %s", id, tc.name)
			}
		})
	}
}

// newKeyWithID is newKey returning the key's id too; admin makes it an
// admin key (which may bake new shapes).
func newKeyWithID(t *testing.T, name string, quota map[string]int, admin bool) (secret, id string) {
	t.Helper()
	body := map[string]any{"name": name, "admin": admin}
	for k, v := range quota {
		body[k] = v
	}
	r := do(t, e.admin, "POST", "/v1/keys", body)
	expect(t, r, 201, "")
	var k struct{ Key, ID string }
	r.json(t, &k)
	return k.Key, k.ID
}

// A paused sandbox never expires: a TTL set while it is paused counts
// from its resume.
func TestPausedSandboxDoesNotExpire(t *testing.T) {
	world(t)
	key := newKey(t, "paused-ttl", nil)
	sb := create(t, key, map[string]any{"ttl_seconds": 600})
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil), 200, "")
	r := do(t, key, "PUT", "/v1/sandboxes/"+sb.ID+"/ttl", map[string]any{"ttl_seconds": 1})
	expect(t, r, 200, "")
	var got sandbox
	r.json(t, &got)
	if got.State != "paused" || got.ExpiresAt != nil {
		t.Fatalf("paused sandbox after PUT /ttl: state %s, expires_at %v; want paused, no expiry", got.State, got.ExpiresAt)
	}
	before := time.Now()
	r = do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	after := time.Now()
	expect(t, r, 200, "")
	r.json(t, &got)
	// Its TTL of 1 s counts from the resume (a second of slack for the
	// catalog's rounding), not the 600 s it had before.
	if got.ExpiresAt == nil || got.ExpiresAt.Before(before) || got.ExpiresAt.After(after.Add(2*time.Second)) {
		t.Fatalf("resumed sandbox expires at %v, want 1 s after the resume (sent %v, answered %v)", got.ExpiresAt, before, after)
	}
	got = waitFor(t, key, sb.ID, "stopped", func(x sandbox) bool { return x.State == "stopped" })
	if got.StopReason != "expired" {
		t.Errorf("stop reason %q, want expired", got.StopReason)
	}
}

// Keys other than admin ones see their own sandboxes in /v1/hosts and the
// default template shapes in /v1/templates, and cannot bake new shapes at
// will.
func TestTenantScopedHostsAndTemplates(t *testing.T) {
	world(t)
	other := newKey(t, "other-tenant", nil)
	create(t, other, nil)
	create(t, other, nil)
	mine := newKey(t, "me", nil)
	create(t, mine, nil)
	var hosts struct {
		Hosts []struct {
			Sandboxes  int      `json:"sandboxes"`
			NetworkOff bool     `json:"network_off"`
			Templates  []string `json:"templates"`
		}
	}
	do(t, mine, "GET", "/v1/hosts", nil).json(t, &hosts)
	if len(hosts.Hosts) != 1 || hosts.Hosts[0].Sandboxes != 1 || !hosts.Hosts[0].NetworkOff {
		t.Errorf("hosts as a tenant with one sandbox: %+v, want one host counting 1, without sandbox networking", hosts)
	}
	// The templates the host holds (a baked tiny), as a fleet's hosts list
	// them (panda hosts showed none on panda up).
	if len(hosts.Hosts) == 1 && !slices.Contains(hosts.Hosts[0].Templates, "tiny") {
		t.Errorf("hosts as a tenant: templates %q, want the baked tiny", hosts.Hosts[0].Templates)
	}
	do(t, e.admin, "GET", "/v1/hosts", nil).json(t, &hosts)
	if len(hosts.Hosts) != 1 || hosts.Hosts[0].Sandboxes < 3 {
		t.Errorf("hosts as admin: %+v, want every sandbox (at least 3)", hosts)
	}

	// Another shape, baked by an admin: tenants do not see it listed.
	expect(t, do(t, e.admin, "POST", "/v1/templates/tiny/bake", map[string]any{"memory_mib": 288}), 200, "")
	var list struct {
		Templates []struct {
			Name      string
			MemoryMiB int `json:"memory_mib"`
		}
	}
	do(t, mine, "GET", "/v1/templates", nil).json(t, &list)
	for _, tm := range list.Templates {
		if tm.MemoryMiB == 288 {
			t.Errorf("a tenant sees the 288 MiB shape another key had baked: %+v", list)
		}
	}
	do(t, e.admin, "GET", "/v1/templates", nil).json(t, &list)
	seen := false
	for _, tm := range list.Templates {
		seen = seen || tm.MemoryMiB == 288
	}
	if !seen {
		t.Errorf("admin does not see the 288 MiB shape: %+v", list)
	}
	// Baking a shape by creating with it: powers of two only for tenants.
	r := do(t, mine, "POST", "/v1/sandboxes", map[string]any{"memory_mib": 300})
	expect(t, r, 422, "invalid")
	if !strings.Contains(string(r.body), "powers of two") {
		t.Errorf("message %s does not say what is allowed", r.body)
	}
}

// vCPUs and disk count against a key's quota.
func TestVCPUAndDiskQuota(t *testing.T) {
	world(t)
	cpu := newKey(t, "vcpu-quota", map[string]int{"max_vcpus": 1})
	create(t, cpu, nil)
	r := do(t, cpu, "POST", "/v1/sandboxes", map[string]any{})
	expect(t, r, 429, "quota_exceeded")
	if !strings.Contains(string(r.body), "vCPU") {
		t.Errorf("vCPU quota message: %s", r.body)
	}
	// tiny's disk is 2 GiB: a 1 GiB disk quota fits none.
	disk := newKey(t, "disk-quota", map[string]int{"max_disk_mib": 1024})
	r = do(t, disk, "POST", "/v1/sandboxes", map[string]any{})
	expect(t, r, 429, "quota_exceeded")
	if !strings.Contains(string(r.body), "disk quota") {
		t.Errorf("disk quota message: %s", r.body)
	}
}

// Requests that hold a guest stream are limited per sandbox: one more
// than the limit is refused at once with 429, and the others are fine.
func TestGuestRequestLimit(t *testing.T) {
	world(t)
	key := newKey(t, "streams", nil)
	sb := create(t, key, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	started := make(chan error, guestLimit)
	for i := 0; i < guestLimit; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.NewReader(`{"cmd":"sleep 120"}`)
			req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/sandboxes/"+sb.ID+"/exec/stream", body)
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				started <- err
				return
			}
			defer res.Body.Close()
			var ev struct{ Type string }
			if err := json.NewDecoder(res.Body).Decode(&ev); err != nil || ev.Type != "start" {
				started <- fmt.Errorf("first event %+v, %v", ev, err)
				return
			}
			started <- nil
			io.Copy(io.Discard, res.Body) // until the test cancels it
		}()
	}
	for i := 0; i < guestLimit; i++ {
		if err := <-started; err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	r := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true"})
	expect(t, r, 429, "too_many_requests")
	cancel()
	wg.Wait()
	// The slots are free again.
	// The server notices the closed streams asynchronously.
	testkit.Poll(time.Minute, func() bool {
		r = do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true"})
		return r.status == 200
	})
	expect(t, r, 200, "")
}

// Buffered exec output is capped per stream and says so.
func TestBufferedExecIsCapped(t *testing.T) {
	world(t)
	key := newKey(t, "bigout", nil)
	sb := create(t, key, nil)
	var res struct {
		Stdout    string `json:"stdout"`
		Truncated bool   `json:"truncated"`
	}
	r := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "head -c 20000000 /dev/zero | tr '\\0' a; printf '\\001\\\"<'"})
	r.json(t, &res)
	if !res.Truncated || len(res.Stdout) != 16<<20 || strings.Trim(res.Stdout, "a") != "" {
		t.Errorf("20 MB of output: truncated %v, %d bytes kept; want truncated, 16 MiB of a", res.Truncated, len(res.Stdout))
	}
	// Escapes and invalid UTF-8 are encoded as JSON strings should be.
	r = do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": `printf 'q"\\b\001<\n\377é'`})
	expect(t, r, 200, "")
	res.Stdout = ""
	r.json(t, &res)
	if want := "q\"\\b\x01<\n\uFFFDé"; res.Stdout != want {
		t.Errorf("stdout %q, want %q", res.Stdout, want)
	}
}

// A record an earlier server left resuming, whose host was still rolling
// the resume back when the new server reconciled (the host said
// resuming), used to stay resuming until the host agent reconnected,
// which may be never (found by panda chaos in split mode: the server
// killed during a resume). The TTL loop now resyncs until it settles: here
// paused, with the interruption in last_error.
func TestResyncSettlesAnOperationInFlightOnTheHost(t *testing.T) {
	world(t)
	key := newKey(t, "resync-in-flight", nil)
	sb := create(t, key, map[string]any{"ttl_seconds": 600})
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil), 200, "")
	ctx := context.Background()
	// What an earlier server left: a resume it had recorded and not seen
	// end.
	if _, err := e.cat.UpdateSandbox(ctx, sb.ID, func(x *catalog.Sandbox) error {
		x.State = catalog.StateResuming
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The host's answer while it still rolls the resume back, then its
	// real answers.
	var calls atomic.Int32
	list := func(context.Context) ([]host.Info, error) {
		infos := e.host.List()
		if calls.Add(1) == 1 {
			for i := range infos {
				if infos[i].ID == sb.ID {
					infos[i].State = lifecycle.Resuming
				}
			}
		}
		return infos, nil
	}
	if err := e.cp.Resync(ctx, list); err != nil {
		t.Fatal(err)
	}
	var got struct {
		State     string `json:"state"`
		LastError string `json:"last_error"`
	}
	deadline := time.Now().Add(time.Minute)
	for {
		do(t, key, "GET", "/v1/sandboxes/"+sb.ID, nil).json(t, &got)
		if got.State != catalog.StateResuming {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still resuming a minute after the host settled it (%d host listings)", sb.ID, calls.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if got.State != catalog.StatePaused || !strings.Contains(got.LastError, "interrupted") {
		t.Errorf("after the host settled: state %s, last_error %q; want paused, interrupted", got.State, got.LastError)
	}
}

// A snapshot an earlier server asked for ends on the host after the new
// server's first Resync (split mode: the agent outlives the server): the
// host lists the sandbox busy meanwhile, so the TTL loop resyncs again
// and records the snapshot for its sandbox's key (found by panda chaos
// --split: a snapshot directory that belonged to no snapshot).
func TestResyncRecordsASnapshotFinishedAfterIt(t *testing.T) {
	world(t)
	key := newKey(t, "resync-late-snapshot", nil)
	sb := create(t, key, map[string]any{"ttl_seconds": 600})
	ctx := context.Background()
	const snapID = "latesnap0000000001"
	var calls atomic.Int32
	list := func(context.Context) ([]host.Info, error) {
		infos := e.host.List()
		if calls.Add(1) == 1 {
			for i := range infos {
				if infos[i].ID == sb.ID {
					infos[i].Busy = true // the earlier server's snapshot in flight
				}
			}
		}
		return infos, nil
	}
	if err := e.cp.Resync(ctx, list); err != nil {
		t.Fatal(err)
	}
	// The snapshot ends on the host; nothing records it but a resync.
	if _, err := e.host.Snapshot(ctx, sb.ID, snapID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/snapshots/"+snapID, nil) })
	deadline := time.Now().Add(time.Minute)
	for do(t, key, "GET", "/v1/snapshots/"+snapID, nil).status != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("snapshot %s finished on the host is not recorded a minute later (%d host listings)", snapID, calls.Load())
		}
		time.Sleep(20 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// A delete of a snapshot interrupted after its host removed the files and
// before the catalog forgot it used to leave the snapshot listed, and
// every create from it failing (found by panda chaos). Reconciling
// finishes the delete.
func TestResyncForgetsASnapshotItsHostDeleted(t *testing.T) {
	world(t)
	key := newKey(t, "resync-deleted-snapshot", nil)
	sb := create(t, key, map[string]any{"ttl_seconds": 600})
	r := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{})
	expect(t, r, 201, "")
	var kept, gone struct{ ID string }
	r.json(t, &kept)
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/snapshots/"+kept.ID, nil) })
	r = do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{})
	expect(t, r, 201, "")
	r.json(t, &gone)
	// The host half of the delete, then the crash.
	if err := e.host.DeleteSnapshot(gone.ID); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := e.cp.Resync(ctx, func(context.Context) ([]host.Info, error) { return e.host.List(), nil }); err != nil {
		t.Fatal(err)
	}
	expect(t, do(t, key, "GET", "/v1/snapshots/"+gone.ID, nil), 404, "not_found")
	expect(t, do(t, key, "GET", "/v1/snapshots/"+kept.ID, nil), 200, "")
}

// A kill while a resume restores the sandbox stops it with stop_reason
// killed. The resume, which then fails because its sandbox is gone, used
// to record vmm_exited over the kill (found by panda chaos: a kill racing
// a resume). The race is hit most of the time; the test never fails when
// it is not.
func TestKillDuringAResumeIsRecordedAsKilled(t *testing.T) {
	world(t)
	key := newKey(t, "kill-during-resume", nil)
	for attempt := range 3 {
		sb := create(t, key, map[string]any{"ttl_seconds": 600})
		expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil), 200, "")
		resumed := make(chan resp, 1)
		go func() { resumed <- do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil) }()
		waitFor(t, key, sb.ID, "resuming", func(x sandbox) bool { return x.State != "paused" })
		expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
		r := <-resumed
		got := waitFor(t, key, sb.ID, "stopped", func(x sandbox) bool { return x.State == "stopped" })
		if got.StopReason != "killed" {
			t.Errorf("attempt %d: sandbox killed during its resume (which answered %d): stop_reason %q, want killed", attempt, r.status, got.StopReason)
		}
	}
}

// A stop that a crash interrupts (the record stopping) is finished by the
// next Resync with the reason it began with: a sandbox that was expiring
// used to be recorded killed (found by panda chaos: a server killed while
// a TTL ran out).
func TestResyncFinishesAStopWithItsReason(t *testing.T) {
	world(t)
	key := newKey(t, "resync-stop-reason", nil)
	sb := create(t, key, map[string]any{"ttl_seconds": 600})
	ctx := context.Background()
	// What an expiry left when the server died: the record stopping, the
	// sandbox still on its host.
	if _, err := e.cat.UpdateSandbox(ctx, sb.ID, func(x *catalog.Sandbox) error {
		x.State, x.StopReason = catalog.StateStopping, "expired"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.Resync(ctx, func(context.Context) ([]host.Info, error) { return e.host.List(), nil }); err != nil {
		t.Fatal(err)
	}
	var got sandbox
	do(t, key, "GET", "/v1/sandboxes/"+sb.ID, nil).json(t, &got)
	if got.State != "stopped" || got.StopReason != "expired" {
		t.Errorf("after Resync: %s (%s), want stopped (expired)", got.State, got.StopReason)
	}
	if _, err := e.host.Get(sb.ID); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("the host still has the stopped sandbox: %v", err)
	}
}
