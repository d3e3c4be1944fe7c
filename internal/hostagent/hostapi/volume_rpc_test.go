package hostapi_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/errs"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// TestVolumeRPC drives the agent's volumes through the client (split
// mode) and checks what it did through the agent itself: the calls, the
// streamed files, and errors of the same text and class as local ones.
func TestVolumeRPC(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	vols := host.Host(client).(host.Volumes)
	lv := local.(host.Volumes)
	const a, b = "vol_rpc0000000000001", "vol_rpc0000000000002"
	t.Cleanup(func() {
		ag.DeleteVolume(a, true)
		ag.DeleteVolume(b, true)
	})
	v, err := vols.CreateVolume(ctx, a, 16<<20)
	if err != nil || v.ID != a || v.LimitBytes != 16<<20 {
		t.Fatalf("CreateVolume = %+v, %v", v, err)
	}
	if got, err := ag.GetVolume(a); err != nil || got.CreatedAt.IsZero() || !got.CreatedAt.Equal(v.CreatedAt) {
		t.Errorf("the agent's volume = %+v, %v; want created at %v", got, err, v.CreatedAt)
	}
	data := make([]byte, 5<<20+7)
	rand.Read(data)
	if n, err := vols.WriteVolumeFile(ctx, a, "/d/blob", bytes.NewReader(data), 0o600); err != nil || n != int64(len(data)) {
		t.Fatalf("WriteVolumeFile = %d, %v", n, err)
	}
	rc, fi, err := vols.ReadVolumeFile(ctx, a, "d/blob")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) || fi.Size != int64(len(data)) || fi.Mode != 0o600 || fi.Path != "/d/blob" {
		t.Errorf("ReadVolumeFile: %d bytes (equal %v), info %+v, %v", len(got), bytes.Equal(got, data), fi, err)
	}
	if err := vols.MkdirVolume(ctx, a, "/e/f"); err != nil {
		t.Fatal(err)
	}
	list, err := vols.ListVolumeDir(ctx, a, "/")
	if err != nil || len(list) != 2 || list[0].Name != "d" || list[1].Name != "e" {
		t.Errorf("ListVolumeDir = %+v, %v", list, err)
	}
	if st, err := vols.StatVolumeFile(ctx, a, "/e/f"); err != nil || !st.IsDir {
		t.Errorf("StatVolumeFile = %+v, %v", st, err)
	}
	if v, err := vols.ResizeVolume(ctx, a, 32<<20); err != nil || v.LimitBytes != 32<<20 || v.UsedBytes < int64(len(data)) {
		t.Errorf("ResizeVolume = %+v, %v", v, err)
	}
	if v, err := vols.BranchVolume(ctx, a, b); err != nil || v.ID != b {
		t.Fatalf("BranchVolume = %+v, %v", v, err)
	}
	if _, err := vols.WriteVolumeFile(ctx, b, "/new", strings.NewReader("branch"), 0); err != nil {
		t.Fatal(err)
	}
	all, err := vols.ListVolumes(ctx)
	if err != nil || len(all) < 2 {
		t.Errorf("ListVolumes = %+v, %v", all, err)
	}
	if v, err := vols.PromoteVolume(ctx, b, a); err != nil || v.ID != a {
		t.Fatalf("PromoteVolume = %+v, %v", v, err)
	}
	if fi, err := lv.StatVolumeFile(ctx, a, "/new"); err != nil || fi.Size != 6 {
		t.Errorf("after promote: %+v, %v", fi, err)
	}
	if err := vols.RemoveVolumeFile(ctx, a, "/d", true); err != nil {
		t.Fatal(err)
	}

	// The same failures, locally and remotely.
	for _, tc := range []struct {
		name string
		call func(h host.Volumes) error
		want error
	}{
		{"missing volume", func(h host.Volumes) error { _, err := h.GetVolume(ctx, "vol_zzzzzzzzzzzzzzzz"); return err }, host.ErrNotFound},
		{"bad id", func(h host.Volumes) error { _, err := h.CreateVolume(ctx, "vol_X", 1); return err }, host.ErrInvalid},
		{"exists", func(h host.Volumes) error { _, err := h.CreateVolume(ctx, a, 1<<20); return err }, host.ErrConflict},
		{"shrink", func(h host.Volumes) error { _, err := h.ResizeVolume(ctx, a, 1); return err }, host.ErrInvalid},
		{"missing file", func(h host.Volumes) error { _, err := h.StatVolumeFile(ctx, a, "/nope"); return err }, guestproto.ErrNotFound},
		{"unclean path", func(h host.Volumes) error { _, _, err := h.ReadVolumeFile(ctx, a, "/../x"); return err }, host.ErrInvalid},
		{"not empty", func(h host.Volumes) error { return h.RemoveVolumeFile(ctx, a, "/e", false) }, guestproto.ErrNotEmpty},
		{"over the limit", func(h host.Volumes) error {
			_, err := h.WriteVolumeFile(ctx, a, "/big", io.LimitReader(zeros{}, 40<<20), 0)
			return err
		}, host.ErrNoSpace},
		{"delete missing", func(h host.Volumes) error { return h.DeleteVolume(ctx, b, false) }, host.ErrNotFound},
	} {
		le, re := tc.call(lv), tc.call(vols)
		if !errors.Is(le, tc.want) || !errors.Is(re, tc.want) {
			t.Errorf("%s: local %v, remote %v; want %v", tc.name, le, re, tc.want)
			continue
		}
		if le.Error() != re.Error() || errs.ClassOf(le) != errs.ClassOf(re) {
			t.Errorf("%s: local %q (%s), remote %q (%s)", tc.name, le, errs.ClassOf(le), re, errs.ClassOf(re))
		}
	}
	if _, err := vols.StatVolumeFile(ctx, a, "/big"); !errors.Is(err, guestproto.ErrNotFound) {
		t.Errorf("a refused write left a file: %v", err)
	}
	if err := vols.DeleteVolume(ctx, a, false); err != nil {
		t.Fatal(err)
	}
	if _, err := lv.GetVolume(ctx, a); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("after delete: %v", fmt.Sprint(err))
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestVolumeRPCSandboxes: a create and a branch fork that mount volumes,
// through the client.
func TestVolumeRPCSandboxes(t *testing.T) {
	world(t)
	ctx := ctxT(t)
	const vol, branch = "vol_rpcsb00000000001", "vol_rpcsb00000000002"
	t.Cleanup(func() {
		ag.DeleteVolume(vol, true)
		ag.DeleteVolume(branch, true)
	})
	if _, err := client.CreateVolume(ctx, vol, 4<<20); err != nil {
		t.Fatal(err)
	}
	mounts := []host.VolumeMount{{Volume: vol, Path: "/mnt/v"}}
	info, err := client.Create(ctx, host.CreateRequest{Volumes: mounts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Kill(context.Background(), info.ID) })
	if len(info.Volumes) != 1 || info.Volumes[0] != mounts[0] {
		t.Errorf("Info.Volumes = %+v, want %+v", info.Volumes, mounts)
	}
	mustRun(t, client, info.ID, "echo guest > /mnt/v/f")
	rc, _, err := client.ReadVolumeFile(ctx, vol, "/f")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "guest\n" {
		t.Errorf("the guest's file through the files API: %q", b)
	}
	cid := host.NewID()
	res, err := client.ForkWithVolumes(ctx, info.ID, []host.ForkSpec{{ID: cid,
		Volumes:  []host.VolumeMount{{Volume: branch, Path: "/mnt/v"}},
		Branches: []host.VolumeBranch{{From: vol, To: branch}}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Children[0].Err != nil {
		t.Fatal(res.Children[0].Err)
	}
	t.Cleanup(func() { ag.Kill(context.Background(), cid) })
	if got := res.Children[0].Info.Volumes; len(got) != 1 || got[0].Volume != branch {
		t.Errorf("child's Volumes = %+v, want the branch", got)
	}
	mustRun(t, client, cid, "echo child > /mnt/v/f")
	if got := mustRun(t, client, info.ID, "cat /mnt/v/f"); got != "guest\n" {
		t.Errorf("the parent reads the branch's write: %q", got)
	}
	if err := client.DeleteVolume(ctx, vol, false); !errors.Is(err, host.ErrConflict) {
		t.Errorf("DeleteVolume while mounted = %v, want ErrConflict", err)
	}
	// A create whose volume is missing fails clearly.
	_, err = client.Create(ctx, host.CreateRequest{Volumes: []host.VolumeMount{{Volume: "vol_missing000000000", Path: "/mnt/v"}}})
	if !errors.Is(err, host.ErrNotFound) {
		t.Errorf("create with a missing volume = %v, want ErrNotFound", err)
	}
	_, err = client.Create(ctx, host.CreateRequest{Volumes: []host.VolumeMount{{Volume: vol, Path: "relative"}}})
	if !errors.Is(err, host.ErrInvalid) {
		t.Errorf("create with a relative mount path = %v, want ErrInvalid", err)
	}
}
