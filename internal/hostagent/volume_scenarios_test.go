package hostagent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// shCode runs cmd in sandbox id and returns its output and exit code.
func shCode(t *testing.T, id, cmd string) (string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := testAgent.Exec(ctxT(t), id, guestproto.ExecRequest{Shell: cmd}, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, id, err)
	}
	return out.String() + errb.String(), res.ExitCode
}

// createWith creates a sandbox mounting mounts, killed when the test ends.
func createWith(t *testing.T, req CreateRequest) Info {
	t.Helper()
	info, err := testAgent.Create(ctxT(t), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { testAgent.Kill(context.Background(), info.ID) })
	return info
}

// TestVolumeGuests runs the volume scenarios on real guests, in one
// sequence that shares its sandboxes (each restore costs seconds under
// TCG): a volume outlives its sandbox; a fork shares it; a branch does
// not; pause, resume and snapshots work with it mounted; a full volume
// says ENOSPC; the guest's symlinks lead nowhere on the host.
func TestVolumeGuests(t *testing.T) {
	a := shared(t)
	const vol, branch = "vol_guest00000000001", "vol_guest00000000002"
	if _, err := a.CreateVolume(vol, 8<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.DeleteVolume(vol, true)
		a.DeleteVolume(branch, true)
	})
	mounts := []host.VolumeMount{{Volume: vol, Path: "/mnt/data"}}

	// A sandbox writes, is killed; another reads what it wrote.
	first := createWith(t, CreateRequest{Volumes: mounts})
	if len(first.Volumes) != 1 || first.Volumes[0] != mounts[0] {
		t.Errorf("Info.Volumes = %+v, want %+v", first.Volumes, mounts)
	}
	sh(t, first.ID, "mkdir -p /mnt/data/dir && echo first > /mnt/data/dir/f")
	if err := a.Kill(ctxT(t), first.ID); err != nil {
		t.Fatal(err)
	}
	if rc, _, err := a.vols.ReadFile(vol, "/dir/f"); err != nil {
		t.Errorf("the host does not have the killed sandbox's file: %v", err)
	} else {
		rc.Close()
	}
	main := createWith(t, CreateRequest{Volumes: mounts})
	if got := sh(t, main.ID, "cat /mnt/data/dir/f"); got != "first\n" {
		t.Errorf("second sandbox reads %q, want first", got)
	}
	// df in the guest shows the volume's size.
	if got := sh(t, main.ID, "df -k /mnt/data | tail -1"); !strings.Contains(got, " 8192 ") {
		t.Errorf("df of the volume: %q, want 8192 KiB", got)
	}
	// The files API's writes are seen at the next open.
	if _, err := a.vols.WriteFile(vol, "/api", strings.NewReader("from api"), 0); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, main.ID, "cat /mnt/data/api"); got != "from api" {
		t.Errorf("guest reads the API's write as %q", got)
	}

	// A plain fork shares the volume: each sees the other's closed writes.
	child := fork(t, main.ID, 1)[0]
	if len(child.Volumes) != 1 || child.Volumes[0] != mounts[0] {
		t.Errorf("fork child's Volumes = %+v, want the parent's", child.Volumes)
	}
	sh(t, main.ID, "echo later > /mnt/data/later")
	if got := sh(t, child.ID, "cat /mnt/data/later"); got != "later\n" {
		t.Errorf("fork child reads the parent's later write as %q", got)
	}
	sh(t, child.ID, "echo child > /mnt/data/from-child")
	if got := sh(t, main.ID, "cat /mnt/data/from-child"); got != "child\n" {
		t.Errorf("parent reads the child's write as %q", got)
	}
	if err := a.Kill(ctxT(t), child.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteVolume(vol, false); !errors.Is(err, ErrConflict) {
		t.Errorf("DeleteVolume while mounted = %v, want ErrConflict", err)
	}

	// A branch fork: the child gets a copy; writes do not cross.
	bid := host.NewID()
	res, err := a.ForkWithVolumes(ctxT(t), main.ID, []host.ForkSpec{{ID: bid,
		Volumes:  []host.VolumeMount{{Volume: branch, Path: "/mnt/data"}},
		Branches: []host.VolumeBranch{{From: vol, To: branch}}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Children[0].Err != nil {
		t.Fatal(res.Children[0].Err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), bid) })
	if got := sh(t, bid, "cat /mnt/data/later"); got != "later\n" {
		t.Errorf("branch child reads %q, want the parent's file", got)
	}
	sh(t, bid, "echo branch > /mnt/data/later; echo new > /mnt/data/branch-only")
	sh(t, main.ID, "echo parent-only > /mnt/data/parent-only")
	if got := sh(t, main.ID, "cat /mnt/data/later; test -e /mnt/data/branch-only && echo crossed; true"); got != "later\n" {
		t.Errorf("parent after the branch wrote: %q", got)
	}
	if got := sh(t, bid, "test -e /mnt/data/parent-only && echo crossed; true"); got != "" {
		t.Errorf("branch sees the parent's new file: %q", got)
	}
	if _, err := a.PromoteVolume(branch, vol); !errors.Is(err, ErrConflict) {
		t.Errorf("PromoteVolume while the branch is mounted = %v, want ErrConflict", err)
	}
	if err := a.Kill(ctxT(t), bid); err != nil {
		t.Fatal(err)
	}
	if _, err := a.PromoteVolume(branch, vol); err != nil {
		t.Fatal(err)
	}
	// The running parent now sees the promoted tree.
	if got := sh(t, main.ID, "cat /mnt/data/later /mnt/data/branch-only; test -e /mnt/data/parent-only && echo kept; true"); got != "branch\nnew\n" {
		t.Errorf("parent after promote reads %q, want the branch's files only", got)
	}

	// Pause and resume keep the mount.
	if _, err := a.Pause(ctxT(t), main.ID); err != nil {
		t.Fatalf("Pause with a mounted volume: %v", err)
	}
	if _, err := a.Resume(ctxT(t), main.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	sh(t, main.ID, "echo resumed >> /mnt/data/later")
	if got := sh(t, main.ID, "cat /mnt/data/later"); got != "branch\nresumed\n" {
		t.Errorf("after resume: %q", got)
	}

	// A snapshot, and a sandbox from it that mounts what its request says.
	snapID := host.NewID()
	if _, err := a.Snapshot(ctxT(t), main.ID, snapID); err != nil {
		t.Fatalf("Snapshot with a mounted volume: %v", err)
	}
	t.Cleanup(func() { a.DeleteSnapshot(snapID) })
	restored := createWith(t, CreateRequest{SnapshotID: snapID, Volumes: mounts})
	if got := sh(t, restored.ID, "cat /mnt/data/later"); got != "branch\nresumed\n" {
		t.Errorf("sandbox from the snapshot reads %q", got)
	}
	if err := a.Kill(ctxT(t), restored.ID); err != nil {
		t.Fatal(err)
	}
	// One that mounts nothing has the captured mount dropped, not hung.
	bare := createWith(t, CreateRequest{SnapshotID: snapID})
	if got := sh(t, bare.ID, "grep -c pandavol /proc/mounts; ls /mnt/data 2>&1 | head -1; true"); !strings.HasPrefix(got, "0\n") || strings.Contains(got, "later") {
		t.Errorf("sandbox from the snapshot without volumes: %q, want no volume mount", got)
	}
	if err := a.Kill(ctxT(t), bare.ID); err != nil {
		t.Fatal(err)
	}

	// A full volume: ENOSPC in the guest, nothing else breaks.
	out, code := shCode(t, main.ID, "dd if=/dev/zero of=/mnt/data/big bs=1M count=16 2>&1")
	if code == 0 || !strings.Contains(out, "No space left") {
		t.Errorf("dd past the limit: exit %d, %q; want No space left", code, out)
	}
	if v, _ := a.GetVolume(vol); v.UsedBytes > v.LimitBytes {
		t.Errorf("used %d over the limit %d", v.UsedBytes, v.LimitBytes)
	}
	sh(t, main.ID, "rm /mnt/data/big && echo small > /mnt/data/small && cat /mnt/data/small && echo alive")

	// Hostile paths: symlinks the guest makes resolve in the guest, and
	// the host never follows them out of the volume.
	marker := hex.EncodeToString(randBytes(16))
	secret := filepath.Join(testDir, "host-secret")
	if err := os.WriteFile(secret, []byte(marker), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(secret) })
	volDir := filepath.Join(a.StoreDir(), volumesDir, vol, "data")
	sh(t, main.ID, "cd /mnt/data && ln -s / root && ln -s ../../../../.. up && ln -s "+secret+" abs && ln -s "+volDir+"/../meta.json meta")
	// (The tiny guest has no /etc/shadow: passwd and hostname say the same.)
	for _, f := range []string{"/etc/shadow", "/etc/passwd", "/etc/hostname"} {
		own, _ := shCode(t, main.ID, "cat "+f+" 2>&1")
		if got, _ := shCode(t, main.ID, "cat /mnt/data/root"+f+" 2>&1"); strings.ReplaceAll(got, "/mnt/data/root", "") != own {
			t.Errorf("x%s through a symlink to / reads %q, not the guest's own %q", f, got, own)
		}
	}
	out, _ = shCode(t, main.ID, "cat /mnt/data/abs /mnt/data/meta /mnt/data/up"+secret+" /mnt/data/../../"+secret+" 2>&1; grep -rs "+marker+" /mnt/data/ 2>&1; ls -la /mnt/data/.. 2>&1")
	if strings.Contains(out, marker) || strings.Contains(out, "limit_bytes") {
		t.Errorf("the guest read host files through its volume: %q", out)
	}
	for _, p := range []string{"/root/etc/passwd", "/abs", "/meta", "/up" + secret} {
		if rc, _, err := a.vols.ReadFile(vol, p); err == nil {
			rc.Close()
			t.Errorf("the files API followed %s out of the volume", p)
		}
	}
	if got := sh(t, main.ID, "echo still alive"); got != "still alive\n" {
		t.Errorf("after the hostile paths: %q", got)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestVolumeAdoption: a sandbox's mounts survive a restart of its host
// agent: the next agent adopts the VMM and serves the volume again, and
// what the guest wrote before and after is on the host.
func TestVolumeAdoption(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	_, open := restartable(t)
	a := open()
	const vol = "vol_adopt00000000001"
	if _, err := a.CreateVolume(vol, 4<<20); err != nil {
		t.Fatal(err)
	}
	info, err := a.Create(ctxT(t), CreateRequest{Volumes: []host.VolumeMount{{Volume: vol, Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, a, info.ID, "echo before > /data/f")
	a.Detach()

	b := open()
	if rec := b.Recover(ctxT(t)); len(rec) != 1 || rec[0].Err != nil || rec[0].State != StateRunning {
		t.Fatalf("Recover = %+v, want %s running", rec, info.ID)
	}
	if got, err := b.Get(info.ID); err != nil || len(got.Volumes) != 1 || got.Volumes[0].Volume != vol {
		t.Errorf("adopted sandbox's Volumes = %+v, %v", got.Volumes, err)
	}
	if got := shOn(t, b, info.ID, "cat /data/f; echo after > /data/g; cat /data/g"); got != "before\nafter\n" {
		t.Errorf("after adoption: %q", got)
	}
	rc, _, err := b.vols.ReadFile(vol, "/g")
	if err != nil {
		t.Fatalf("the host lacks the adopted guest's write: %v", err)
	}
	rc.Close()
	if err := b.DeleteVolume(vol, false); !errors.Is(err, ErrConflict) {
		t.Errorf("DeleteVolume of the adopted sandbox's volume = %v, want ErrConflict", err)
	}
}
