package controlplane_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/hosttest"
)

func TestVolumeNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"data", true}, {"a", true}, {"0", true}, {"my.data_v2-x", true}, {strings.Repeat("a", 63), true},
		{"", false}, {strings.Repeat("a", 64), false}, {"Data", false}, {"-data", false}, {".data", false},
		{"_data", false}, {"da ta", false}, {"da/ta", false}, {"dätä", false}, {"vol_0123456789abcdef", false},
		{"vol_0123456789abcde", true}, // not an id's length: a name
	} {
		if got := controlplane.ValidVolumeName(tc.name); got != tc.ok {
			t.Errorf("ValidVolumeName(%q) = %v, want %v", tc.name, got, tc.ok)
		}
	}
	id := "k3v9q2m8x7c1b5n4z6a0"
	for _, src := range []string{"data", strings.Repeat("a", 63), strings.Repeat("a", 41) + ".xyz"} {
		got := controlplane.BranchName(src, id)
		if !controlplane.ValidVolumeName(got) || !strings.HasSuffix(got, "-"+id) || !strings.HasPrefix(src, strings.TrimSuffix(got, "-"+id)) {
			t.Errorf("BranchName(%q) = %q: want a valid name, a prefix of the source, then -%s", src, got, id)
		}
	}
	if got := controlplane.BranchName("data", id); got != "data-"+id {
		t.Errorf("BranchName(data) = %q", got)
	}
}

func TestVolumeFilePaths(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, want string // want "" = refused
	}{
		{"", "/"}, {"/", "/"}, {"a/b", "/a/b"}, {"/a/b", "/a/b"}, {"/a//b/", "/a/b"}, {"./a", "/a"},
		{"..", ""}, {"/a/../b", ""}, {"../etc/passwd", ""}, {"a\x00b", ""}, {"\xff", ""}, {strings.Repeat("a", 4097), ""},
		{"a..b", "/a..b"},
	} {
		got, err := controlplane.CheckVolumeFilePath(tc.in)
		if tc.want == "" {
			if err == nil {
				t.Errorf("CheckVolumeFilePath(%q) = %q, want an error", tc.in, got)
			} else if controlplane.Classify(err).Kind != controlplane.Invalid {
				t.Errorf("CheckVolumeFilePath(%q): %v, want Invalid", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("CheckVolumeFilePath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestVolumeMountPaths(t *testing.T) {
	t.Parallel()
	m := func(paths ...string) []controlplane.VolumeMountRequest {
		var out []controlplane.VolumeMountRequest
		for _, p := range paths {
			out = append(out, controlplane.VolumeMountRequest{Name: "v", Path: p})
		}
		return out
	}
	for _, tc := range []struct {
		paths []string
		bad   string // a word of the error; "" = accepted
	}{
		{[]string{"/mnt/data"}, ""},
		{[]string{"/mnt/a", "/mnt/b", "/data", "/home/user/work"}, ""},
		{[]string{"/mnt/data", "/mnt/data2"}, ""},
		{[]string{"/proc2", "/sysx", "/devices"}, ""},
		{[]string{"/a", "/b", "/c", "/d", "/e", "/f", "/g", "/h", "/i"}, "at most 8"},
		{[]string{"mnt/data"}, "absolute"},
		{[]string{"/mnt/data/"}, "clean"},
		{[]string{"/mnt/../data"}, "clean"},
		{[]string{"/"}, "at /"},
		{[]string{""}, "not a valid path"},
		{[]string{"/proc"}, "/proc"},
		{[]string{"/sys/fs"}, "/sys"},
		{[]string{"/dev/shm"}, "/dev"},
		{[]string{"/mnt", "/mnt/data"}, "overlap"},
		{[]string{"/mnt/data", "/mnt"}, "overlap"},
		{[]string{"/x", "/x"}, "overlap"},
	} {
		err := controlplane.CheckMountPaths(m(tc.paths...))
		switch {
		case tc.bad == "" && err != nil:
			t.Errorf("%v: %v, want accepted", tc.paths, err)
		case tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)):
			t.Errorf("%v: %v, want an error saying %q", tc.paths, err, tc.bad)
		}
	}
}

// mkVolume creates a volume of e's key or fails the test.
func (e *env) mkVolume(name string, sizeMiB int) catalog.Volume {
	e.t.Helper()
	v, err := e.p.CreateVolume(e.t.Context(), e.key, name, sizeMiB)
	if err != nil {
		e.t.Fatalf("create volume %s: %v", name, err)
	}
	return v
}

func TestVolumeLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *controlplane.Config) { c.MaxVolumesPerKey = 3; c.MaxDiskMiBPerKey = 5000 })
	ctx := t.Context()
	v := e.mkVolume("data", 0)
	if v.SizeMiB != controlplane.DefaultVolumeSizeMiB || v.HostID != "local" || !strings.HasPrefix(v.ID, "vol_") || !e.h.HasVolume(v.ID) {
		t.Fatalf("created %+v (on host: %v)", v, e.h.HasVolume(v.ID))
	}
	_, err := e.p.CreateVolume(ctx, e.key, "data", 1)
	wantKind(t, "same name", err, controlplane.Conflict, []string{"data"})
	_, err = e.p.CreateVolume(ctx, e.key, "Bad Name", 1)
	wantKind(t, "bad name", err, controlplane.Invalid, []string{"Bad Name"})
	_, err = e.p.CreateVolume(ctx, e.key, "neg", -1)
	wantKind(t, "negative size", err, controlplane.Invalid, []string{"size_mib"})
	// Another key sees none of it, by name or id.
	other := e.newKey("key_other")
	for _, n := range []string{"data", v.ID} {
		_, err := e.p.Volume(ctx, other.ID, n)
		wantKind(t, "another key's volume", err, controlplane.NotFound, []string{n})
	}
	if got, err := e.p.Volume(ctx, e.key.ID, v.ID); err != nil || got.Name != "data" {
		t.Errorf("Volume by id = %+v, %v", got, err)
	}

	// Quotas: the disk (1024 held of 5000), then the count (3).
	_, err = e.p.CreateVolume(ctx, e.key, "huge", 4000)
	wantKind(t, "over the disk quota", err, controlplane.QuotaExceeded, []string{"disk"})
	e.mkVolume("two", 1)
	e.mkVolume("three", 1)
	_, err = e.p.CreateVolume(ctx, e.key, "four", 1)
	wantKind(t, "over the volume count", err, controlplane.QuotaExceeded, []string{"volume", "3"})

	// A host that cannot make it leaves no record.
	if err := e.p.DeleteVolume(ctx, e.volume("three"), false); err != nil {
		t.Fatal(err)
	}
	e.h.Fail(hosttest.CreateVolume, "", host.ErrNoSpace)
	_, err = e.p.CreateVolume(ctx, e.key, "failed", 1)
	wantKind(t, "host out of space", err, controlplane.NoSpace, nil)
	if _, err := e.p.Volume(ctx, e.key.ID, "failed"); err == nil {
		t.Error("a volume its host did not make is recorded")
	}

	// Grow, not shrink; a host that cannot grow it leaves its size.
	v, err = e.p.ResizeVolume(ctx, e.key, v, 2048)
	if err != nil || v.SizeMiB != 2048 {
		t.Fatalf("grow: %+v, %v", v, err)
	}
	if info, _ := e.h.GetVolume(ctx, v.ID); info.LimitBytes != 2048<<20 {
		t.Errorf("host limit %d after grow", info.LimitBytes)
	}
	_, err = e.p.ResizeVolume(ctx, e.key, v, 1024)
	wantKind(t, "shrink", err, controlplane.Invalid, []string{"only grow"})
	_, err = e.p.ResizeVolume(ctx, e.key, v, 5000)
	wantKind(t, "grow over the disk quota", err, controlplane.QuotaExceeded, []string{"disk"})
	e.h.Fail(hosttest.ResizeVolume, v.ID, errBoom)
	if _, err := e.p.ResizeVolume(ctx, e.key, v, 3000); err == nil {
		t.Error("grow that its host failed: no error")
	}
	if got := e.volume("data"); got.SizeMiB != 2048 {
		t.Errorf("size %d after a failed grow, want 2048", got.SizeMiB)
	}

	// Files, through the home host.
	if _, err := e.p.WriteVolumeFile(ctx, v, "/dir/a.txt", strings.NewReader("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	rc, fi, err := e.p.ReadVolumeFile(ctx, v, "dir/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" || fi.Size != 5 {
		t.Errorf("read %q (%d), want hello", b, fi.Size)
	}
	if list, err := e.p.ListVolumeDir(ctx, v, "/dir"); err != nil || len(list) != 1 || list[0].Name != "a.txt" {
		t.Errorf("list /dir = %+v, %v", list, err)
	}
	_, err = e.p.StatVolumeFile(ctx, v, "/nope")
	wantKind(t, "stat a missing file", err, controlplane.NotFound, []string{"/nope", "data"})
	_, _, err = e.p.ReadVolumeFile(ctx, v, "/../etc/passwd")
	wantKind(t, "path with ..", err, controlplane.Invalid, []string{".."})
	wantKind(t, "remove the root", e.p.RemoveVolumeFile(ctx, v, "/", true), controlplane.Invalid, []string{"root"})
	small := e.mkVolume("small", 1)
	_, err = e.p.WriteVolumeFile(ctx, small, "/big", strings.NewReader(strings.Repeat("x", 1<<20+1)), 0o644)
	wantKind(t, "write over the volume's size", err, controlplane.NoSpace, []string{"small", "full", "1 MiB"})
	if err := e.p.RemoveVolumeFile(ctx, v, "/dir", true); err != nil {
		t.Errorf("remove -r: %v", err)
	}
	// Used bytes come from the host.
	if _, err := e.p.WriteVolumeFile(ctx, v, "/b", strings.NewReader("12345678"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := e.p.RefreshVolume(ctx, v); got.UsedBytes != 8 {
		t.Errorf("used bytes %d, want 8", got.UsedBytes)
	}
	vs, err := e.p.ListVolumes(ctx, e.key.ID)
	if err != nil || len(vs) != 3 {
		t.Fatalf("ListVolumes = %+v, %v", vs, err)
	}
	for _, x := range vs {
		if x.Name == "data" && x.UsedBytes != 8 {
			t.Errorf("ListVolumes: data uses %d bytes, want 8", x.UsedBytes)
		}
	}
}

// volume is e's key's volume name or fails the test.
func (e *env) volume(name string) catalog.Volume {
	e.t.Helper()
	v, err := e.p.Volume(e.t.Context(), e.key.ID, name)
	if err != nil {
		e.t.Fatalf("volume %s: %v", name, err)
	}
	return v
}

func TestVolumeMounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	v := e.mkVolume("data", 16)
	ro := e.mkVolume("ref", 16)
	sb := e.create(controlplane.CreateRequest{Template: "base", Volumes: []controlplane.VolumeMountRequest{
		{Name: "data", Path: "/mnt/data"}, {Name: ro.ID, Path: "/ref", ReadOnly: true}}})
	want := []catalog.VolumeMount{{VolumeID: v.ID, Path: "/mnt/data"}, {VolumeID: ro.ID, Path: "/ref", ReadOnly: true}}
	if got := e.get(sb.ID).Volumes; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("record mounts %+v, want %+v", got, want)
	}
	info, _ := e.h.Sandbox(sb.ID)
	if len(info.Volumes) != 2 || info.Volumes[0] != (host.VolumeMount{Volume: v.ID, Path: "/mnt/data"}) || !info.Volumes[1].ReadOnly {
		t.Errorf("host was asked to mount %+v", info.Volumes)
	}
	if ids, err := e.p.MountedBy(ctx, v); err != nil || len(ids) != 1 || ids[0] != sb.ID {
		t.Errorf("MountedBy = %v, %v", ids, err)
	}

	for _, tc := range []struct {
		name string
		ms   []controlplane.VolumeMountRequest
		kind controlplane.Kind
		says string
	}{
		{"unknown volume", []controlplane.VolumeMountRequest{{Name: "nope", Path: "/x"}}, controlplane.NotFound, "nope"},
		{"twice", []controlplane.VolumeMountRequest{{Name: "data", Path: "/x"}, {Name: v.ID, Path: "/y"}}, controlplane.Invalid, "twice"},
		{"bad path", []controlplane.VolumeMountRequest{{Name: "data", Path: "/proc/x"}}, controlplane.Invalid, "/proc"},
	} {
		n := len(e.records(e.key.ID))
		_, err := e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: tc.ms})
		wantKind(t, tc.name, err, tc.kind, []string{tc.says})
		if len(e.records(e.key.ID)) != n {
			t.Errorf("%s: a refused create left a record", tc.name)
		}
	}
	// Another key cannot mount it.
	other := e.newKey("key_other")
	_, err := e.p.Create(ctx, other, controlplane.CreateRequest{Template: "base", Volumes: []controlplane.VolumeMountRequest{{Name: v.ID, Path: "/x"}}})
	wantKind(t, "another key's volume", err, controlplane.NotFound, nil)

	// Mounted: no delete without force, no promote of it.
	wantKind(t, "delete while mounted", e.p.DeleteVolume(ctx, v, false), controlplane.Conflict, []string{sb.ID, "force"})
	// A kill does nothing to the volume; then it can go.
	if _, err := e.p.WriteVolumeFile(ctx, v, "/keep", strings.NewReader("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.p.Stop(ctx, sb.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	if b, ok := e.h.VolumeFile(v.ID, "/keep"); !ok || string(b) != "kept" {
		t.Errorf("volume file after the kill: %q, %v", b, ok)
	}
	if ids, _ := e.p.MountedBy(ctx, v); len(ids) != 0 {
		t.Errorf("MountedBy after the kill = %v", ids)
	}
	if err := e.p.DeleteVolume(ctx, v, false); err != nil {
		t.Errorf("delete after the kill: %v", err)
	}
	if e.h.HasVolume(v.ID) {
		t.Error("host still has the deleted volume")
	}
	// Forced: while mounted.
	sb2 := e.create(controlplane.CreateRequest{Template: "base", Volumes: []controlplane.VolumeMountRequest{{Name: "ref", Path: "/ref"}}})
	if err := e.p.DeleteVolume(ctx, ro, true); err != nil {
		t.Errorf("forced delete: %v", err)
	}
	if _, err := e.p.Volume(ctx, e.key.ID, "ref"); err == nil || e.h.HasVolume(ro.ID) {
		t.Error("forced delete left the volume")
	}
	if e.get(sb2.ID).State != catalog.StateRunning {
		t.Error("forced delete stopped the sandbox that mounted it")
	}
}

func TestVolumeForkBranch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *controlplane.Config) { c.MaxVolumesPerKey = 3 })
	ctx := t.Context()
	v := e.mkVolume("data", 16)
	if _, err := e.p.WriteVolumeFile(ctx, v, "/f", strings.NewReader("parent"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent := e.create(controlplane.CreateRequest{Template: "base", Volumes: []controlplane.VolumeMountRequest{{Name: "data", Path: "/mnt/data"}}})

	// Share (the default): children mount the parent's volume.
	got, err := e.p.Fork(ctx, e.key, parent, 1, scheduler.Placement{}, "")
	if err != nil || got.Children[0].Sandbox == nil {
		t.Fatalf("share fork: %+v, %v", got, err)
	}
	if m := got.Children[0].Sandbox.Volumes; len(m) != 1 || m[0].VolumeID != v.ID {
		t.Errorf("shared child mounts %+v", m)
	}
	_, err = e.p.Fork(ctx, e.key, parent, 1, scheduler.Placement{}, "copy")
	wantKind(t, "bad volume_mode", err, controlplane.Invalid, []string{"volume_mode"})

	// Branches that do not fit (1 volume held, 3 allowed, 3 asked): the
	// fork fails before the host forks, and leaves nothing.
	n := len(e.live(e.key.ID))
	_, err = e.p.Fork(ctx, e.key, parent, 3, scheduler.Placement{}, controlplane.VolumeBranch)
	wantKind(t, "branches over quota", err, controlplane.QuotaExceeded, []string{"volume"})
	if e.h.CallsOf(hosttest.ForkWithVolumes, parent.ID) != 0 {
		t.Error("the host forked although the branches were over quota")
	}
	if len(e.live(e.key.ID)) != n {
		t.Errorf("%d live sandboxes after a refused fork, want %d", len(e.live(e.key.ID)), n)
	}
	if vs, _ := e.p.ListVolumes(ctx, e.key.ID); len(vs) != 1 {
		t.Errorf("%d volumes after a refused fork, want 1", len(vs))
	}

	// Two branches fit.
	got, err = e.p.Fork(ctx, e.key, parent, 2, scheduler.Placement{}, controlplane.VolumeBranch)
	if err != nil {
		t.Fatalf("branch fork: %v", err)
	}
	var branches []catalog.Volume
	for _, c := range got.Children {
		if c.Sandbox == nil {
			t.Fatalf("child failed: %v", c.Err)
		}
		child := c.Sandbox
		b, err := e.p.Volume(ctx, e.key.ID, "data-"+child.ID)
		if err != nil {
			t.Fatalf("branch of %s: %v", child.ID, err)
		}
		if b.ParentID != v.ID || b.HostID != v.HostID || b.SizeMiB != v.SizeMiB {
			t.Errorf("branch %+v, want parent %s", b, v.ID)
		}
		if m := e.get(child.ID).Volumes; len(m) != 1 || m[0].VolumeID != b.ID || m[0].Path != "/mnt/data" {
			t.Errorf("child %s mounts %+v, want its branch %s", child.ID, m, b.ID)
		}
		if info, _ := e.h.Sandbox(child.ID); len(info.Volumes) != 1 || info.Volumes[0].Volume != b.ID {
			t.Errorf("host child mounts %+v", info.Volumes)
		}
		if f, ok := e.h.VolumeFile(b.ID, "/f"); !ok || string(f) != "parent" {
			t.Errorf("branch file = %q, %v; want the parent's", f, ok)
		}
		branches = append(branches, b)
	}

	// Promote: not while its child runs; then the parent holds its files.
	b := branches[0]
	if _, err := e.p.WriteVolumeFile(ctx, b, "/f", strings.NewReader("branch"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.PromoteVolume(ctx, b)
	wantKind(t, "promote a mounted branch", err, controlplane.Conflict, []string{got.Children[0].Sandbox.ID})
	if err := e.p.Stop(ctx, got.Children[0].Sandbox.ID, "killed"); err != nil {
		t.Fatal(err)
	}
	// The child's branch outlives it.
	if _, err := e.p.Volume(ctx, e.key.ID, b.Name); err != nil {
		t.Errorf("branch gone with its child: %v", err)
	}
	pv, err := e.p.PromoteVolume(ctx, b)
	if err != nil || pv.ID != v.ID {
		t.Fatalf("promote: %+v, %v", pv, err)
	}
	if f, _ := e.h.VolumeFile(v.ID, "/f"); string(f) != "branch" {
		t.Errorf("parent file after promote = %q, want the branch's", f)
	}
	if _, err := e.p.Volume(ctx, e.key.ID, b.Name); err == nil || e.h.HasVolume(b.ID) {
		t.Error("promoted branch still exists")
	}
	_, err = e.p.PromoteVolume(ctx, v)
	wantKind(t, "promote a volume without parent", err, controlplane.Invalid, []string{"not branched"})

	// A fork that fails on the host leaves no branch behind.
	e.h.Fail(hosttest.ForkWithVolumes, parent.ID, errBoom)
	if err := e.p.DeleteVolume(ctx, branches[1], true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Fork(ctx, e.key, parent, 1, scheduler.Placement{}, controlplane.VolumeBranch); err == nil {
		t.Error("fork the host failed: no error")
	}
	if vs, _ := e.p.ListVolumes(ctx, e.key.ID); len(vs) != 1 {
		t.Errorf("volumes after a failed branch fork: %d, want 1", len(vs))
	}
}

// In a fleet, a sandbox that mounts volumes runs on their host.
func TestVolumeFleetPlacement(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, false)
	ctx := t.Context()
	on := func(name, hostID string) catalog.Volume {
		t.Helper()
		for id := range e.f.hosts {
			if id != hostID {
				e.f.set(id, scheduler.Draining)
			}
		}
		defer func() {
			for id := range e.f.hosts {
				e.f.set(id, scheduler.Ready)
			}
		}()
		v, err := e.p.CreateVolume(ctx, e.key, name, 16)
		if err != nil || v.HostID != hostID {
			t.Fatalf("create volume on %s: %+v, %v", hostID, v, err)
		}
		return v
	}
	va, vb := on("va", "a"), on("vb", "b")
	if !e.a.HasVolume(va.ID) || e.b.HasVolume(va.ID) || !e.b.HasVolume(vb.ID) {
		t.Error("volume va not (only) on its host a")
	}
	mount := func(names ...string) []controlplane.VolumeMountRequest {
		var out []controlplane.VolumeMountRequest
		for _, n := range names {
			out = append(out, controlplane.VolumeMountRequest{Name: n, Path: "/" + n})
		}
		return out
	}
	for range 3 {
		sb, err := e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: mount("vb")})
		if err != nil || sb.HostID != "b" {
			t.Fatalf("create mounting vb: on %q, %v; want host b", sb.HostID, err)
		}
	}
	_, err := e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: mount("va", "vb")})
	wantKind(t, "volumes of two hosts", err, controlplane.Conflict, []string{"va", "vb", "different hosts"})
	_, err = e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: mount("va"), Placement: scheduler.Placement{Host: "b"}})
	wantKind(t, "placement elsewhere", err, controlplane.Conflict, []string{"va", "host a"})
	e.f.set("a", scheduler.Draining)
	_, err = e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: mount("va")})
	wantKind(t, "home host draining", err, controlplane.Unavailable, []string{"(a)"})
	e.f.set("a", scheduler.Lost)
	_, err = e.p.Create(ctx, e.key, controlplane.CreateRequest{Template: "base", Volumes: mount("va")})
	wantKind(t, "home host lost", err, controlplane.Unavailable, []string{"a"})
	_, err = e.p.WriteVolumeFile(ctx, va, "/x", strings.NewReader("x"), 0o644)
	wantKind(t, "files of a volume whose host is lost", err, controlplane.Unavailable, []string{"a"})
	e.f.set("a", scheduler.Ready)

	// Forks stay with their volumes.
	parent := e.createOnWith("a", mount("va"))
	got, err := e.p.Fork(ctx, e.key, parent, 2, scheduler.Placement{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Children {
		if c.Sandbox == nil || c.Sandbox.HostID != "a" {
			t.Errorf("fork child of a parent with volumes: %+v", c)
		}
	}
	_, err = e.p.Fork(ctx, e.key, parent, 2, scheduler.Placement{Spread: true}, "")
	wantKind(t, "spread fork", err, controlplane.Invalid, []string{"spread"})
	_, err = e.p.Fork(ctx, e.key, parent, 1, scheduler.Placement{Host: "b"}, "")
	wantKind(t, "fork elsewhere", err, controlplane.Conflict, []string{"host a"})
	if !errors.Is(err, controlplane.Conflict) {
		t.Errorf("fork elsewhere: %v is not a Conflict", err)
	}
}

func (e *fleetEnv) createOnWith(hostID string, ms []controlplane.VolumeMountRequest) catalog.Sandbox {
	e.t.Helper()
	sb, err := e.p.Create(e.t.Context(), e.key, controlplane.CreateRequest{Template: "base", Volumes: ms})
	if err != nil || sb.HostID != hostID {
		e.t.Fatalf("create on %s: %+v, %v", hostID, sb.HostID, err)
	}
	return sb
}

// A sandbox that mounts volumes does not move: not by a drain's
// migration, not to resume elsewhere.
func TestVolumeSandboxStays(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t, true)
	ctx := t.Context()
	e.f.set("b", scheduler.Draining)
	if _, err := e.p.CreateVolume(ctx, e.key, "v", 16); err != nil {
		t.Fatal(err)
	}
	e.f.set("b", scheduler.Ready)
	sb := e.createOnWith("a", []controlplane.VolumeMountRequest{{Name: "v", Path: "/v"}})
	_, err := e.p.MoveTo(ctx, sb.ID)
	wantKind(t, "move", err, controlplane.Conflict, []string{"volumes", "host a"})
	if got := e.get(sb.ID); got.HostID != "a" || got.State != catalog.StateRunning {
		t.Errorf("after a refused move: %s on %s", got.State, got.HostID)
	}
	if _, err := e.p.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.ResumeOn(ctx, sb.ID, scheduler.Placement{Host: "b"})
	wantKind(t, "resume elsewhere", err, controlplane.Conflict, []string{"host a"})
	got, err := e.p.ResumeOn(ctx, sb.ID, scheduler.Placement{})
	if err != nil || got.HostID != "a" {
		t.Errorf("resume: on %q, %v; want host a", got.HostID, err)
	}
}
