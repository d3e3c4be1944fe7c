package rest_test

import (
	"bytes"
	"strings"
	"testing"
)

// volume is the Volume schema as the tests read it.
type volume struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	SizeMiB   int      `json:"size_mib"`
	UsedBytes int64    `json:"used_bytes"`
	Parent    string   `json:"parent"`
	MountedBy []string `json:"mounted_by"`
}

func getVolume(t *testing.T, key, name string) volume {
	t.Helper()
	r := do(t, key, "GET", "/v1/volumes/"+name, nil)
	expect(t, r, 200, "")
	var v volume
	r.json(t, &v)
	return v
}

// The volumes API without a guest: create, list, get, grow, the files
// routes, delete; who sees what; bad input.
func TestVolumeAPI(t *testing.T) {
	world(t)
	key := newKey(t, "volumes", map[string]int{"max_disk_mib": 3000})
	other := newKey(t, "volumes-other", nil)

	r := do(t, key, "POST", "/v1/volumes", map[string]any{"name": "data", "size_mib": 16})
	expect(t, r, 201, "")
	var v volume
	r.json(t, &v)
	if v.Name != "data" || v.SizeMiB != 16 || !strings.HasPrefix(v.ID, "vol_") || v.MountedBy == nil || len(v.MountedBy) != 0 || v.Parent != "" {
		t.Fatalf("created %s", r.body)
	}
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/volumes/data?force=true", nil) })
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "data"}), 409, "conflict")
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "Not Valid"}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "x", "size_mib": 0}), 422, "invalid")
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "x", "size": 1}), 400, "bad_request")
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "huge", "size_mib": 4000}), 429, "quota_exceeded")
	// The default size.
	r = do(t, key, "POST", "/v1/volumes", map[string]any{"name": "dflt"})
	expect(t, r, 201, "")
	var d volume
	r.json(t, &d)
	if d.SizeMiB != 1024 {
		t.Errorf("default size %d MiB, want 1024", d.SizeMiB)
	}
	expect(t, do(t, key, "DELETE", "/v1/volumes/dflt", nil), 204, "")
	expect(t, do(t, key, "GET", "/v1/volumes/dflt", nil), 404, "not_found")

	// By name or id; another key's is not found; the list is the key's.
	if got := getVolume(t, key, v.ID); got.Name != "data" {
		t.Errorf("get by id: %+v", got)
	}
	for _, p := range []string{"/v1/volumes/data", "/v1/volumes/" + v.ID, "/v1/volumes/data/files/list?path=/"} {
		expect(t, do(t, other, "GET", p, nil), 404, "not_found")
	}
	var list struct{ Volumes []volume }
	do(t, key, "GET", "/v1/volumes", nil).json(t, &list)
	if len(list.Volumes) != 1 || list.Volumes[0].ID != v.ID {
		t.Errorf("list: %+v", list.Volumes)
	}
	do(t, other, "GET", "/v1/volumes", nil).json(t, &list)
	if len(list.Volumes) != 0 {
		t.Errorf("another key lists %+v", list.Volumes)
	}

	// Files, as the sandbox files routes.
	files := "/v1/volumes/data/files"
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	r = do(t, key, "PUT", files+"?path=/dir/blob.bin&mode=600", data)
	expect(t, r, 200, "")
	var fi struct {
		Name  string
		Path  string
		Size  int64
		Mode  uint32
		IsDir bool `json:"is_dir"`
	}
	r.json(t, &fi)
	if fi.Size != int64(len(data)) || fi.Mode != 0o600 || fi.Name != "blob.bin" {
		t.Errorf("uploaded %s", r.body)
	}
	r = do(t, key, "GET", files+"?path=dir/blob.bin", nil)
	if r.status != 200 || !bytes.Equal(r.body, data) || r.header.Get("X-Panda-File-Mode") != "384" {
		t.Errorf("download: %d, %d bytes, mode %q", r.status, len(r.body), r.header.Get("X-Panda-File-Mode"))
	}
	expect(t, do(t, key, "POST", files+"/mkdir", map[string]any{"path": "/dir/sub/deeper"}), 200, "")
	r = do(t, key, "GET", files+"/list?path=/dir", nil)
	expect(t, r, 200, "")
	var entries struct{ Entries []struct{ Name string } }
	r.json(t, &entries)
	if len(entries.Entries) != 2 || entries.Entries[0].Name != "blob.bin" || entries.Entries[1].Name != "sub" {
		t.Errorf("list /dir: %s", r.body)
	}
	r = do(t, key, "GET", files+"/stat?path=/dir/sub", nil)
	expect(t, r, 200, "")
	r.json(t, &fi)
	if !fi.IsDir {
		t.Errorf("stat /dir/sub: %s", r.body)
	}
	if got := getVolume(t, key, "data"); got.UsedBytes < int64(len(data)) {
		t.Errorf("used bytes %d after a %d-byte upload", got.UsedBytes, len(data))
	}
	expect(t, do(t, key, "GET", files+"?path=/nope", nil), 404, "not_found")
	expect(t, do(t, key, "GET", files+"?path=/../etc/passwd", nil), 422, "invalid")
	expect(t, do(t, key, "GET", files, nil), 422, "invalid")
	expect(t, do(t, key, "DELETE", files+"?path=/", nil), 422, "invalid")
	expect(t, do(t, key, "DELETE", files+"?path=/dir", nil), 409, "")
	expect(t, do(t, key, "DELETE", files+"?path=/dir&recursive=true", nil), 204, "")
	expect(t, do(t, key, "GET", files+"/stat?path=/dir", nil), 404, "not_found")
	// The size bounds writes.
	r = do(t, key, "PUT", files+"?path=/big", bytes.Repeat([]byte{1}, 16<<20+1))
	expect(t, r, 507, "insufficient_storage")
	if !strings.Contains(string(r.body), "data") {
		t.Errorf("write over the size: %s, want it to name the volume", r.body)
	}

	// Grow only.
	expect(t, do(t, key, "PATCH", "/v1/volumes/data", map[string]any{"size_mib": 8}), 422, "invalid")
	expect(t, do(t, key, "PATCH", "/v1/volumes/data", map[string]any{}), 422, "invalid")
	expect(t, do(t, key, "PATCH", "/v1/volumes/data", map[string]any{"size_mib": 5000}), 429, "quota_exceeded")
	r = do(t, key, "PATCH", "/v1/volumes/data", map[string]any{"size_mib": 64})
	expect(t, r, 200, "")
	r.json(t, &v)
	if v.SizeMiB != 64 {
		t.Errorf("grown to %d MiB", v.SizeMiB)
	}
	expect(t, do(t, key, "PUT", files+"?path=/big", bytes.Repeat([]byte{1}, 16<<20+1)), 200, "")
	expect(t, do(t, key, "POST", "/v1/volumes/data/promote", nil), 422, "invalid")
	expect(t, do(t, key, "DELETE", "/v1/volumes/data?force=maybe", nil), 422, "invalid")
}

// Sandboxes mount volumes: what one writes, the files API and another
// sandbox read; delete while mounted; a fork's branches and promote.
func TestVolumeMountsAPI(t *testing.T) {
	world(t)
	key := newKey(t, "volume-mounts", nil)
	expect(t, do(t, key, "POST", "/v1/volumes", map[string]any{"name": "shared", "size_mib": 32}), 201, "")
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/volumes/shared?force=true", nil) })
	expect(t, do(t, key, "PUT", "/v1/volumes/shared/files?path=/seed.txt", "seeded\n"), 200, "")

	for _, bad := range []map[string]any{
		{"name": "nope", "path": "/mnt"},
		{"name": "shared", "path": "relative"},
		{"name": "shared", "path": "/proc/x"},
	} {
		r := do(t, key, "POST", "/v1/sandboxes", map[string]any{"volumes": []any{bad}})
		if r.status != 404 && r.status != 422 {
			t.Errorf("create mounting %v: %d %s, want 404 or 422", bad, r.status, r.body)
		}
	}

	r := do(t, key, "POST", "/v1/sandboxes", map[string]any{"volumes": []any{map[string]any{"name": "shared", "path": "/mnt/shared"}}})
	expect(t, r, 201, "")
	var sb struct {
		ID      string
		Volumes []struct {
			Name     string
			Path     string
			ReadOnly bool `json:"read_only"`
		}
	}
	r.json(t, &sb)
	t.Cleanup(func() { do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil) })
	if len(sb.Volumes) != 1 || sb.Volumes[0].Name != "shared" || sb.Volumes[0].Path != "/mnt/shared" {
		t.Fatalf("sandbox volumes: %s", r.body)
	}
	if v := getVolume(t, key, "shared"); len(v.MountedBy) != 1 || v.MountedBy[0] != sb.ID {
		t.Errorf("mounted_by %v, want [%s]", v.MountedBy, sb.ID)
	}
	x := run(t, key, sb.ID, map[string]any{"cmd": "cat /mnt/shared/seed.txt && echo from-guest > /mnt/shared/out.txt && df -m /mnt/shared | tail -1"})
	if x.ExitCode != 0 || !strings.HasPrefix(x.Stdout, "seeded\n") {
		t.Fatalf("guest reads the volume: %+v", x)
	}
	if f := strings.Fields(strings.Split(x.Stdout, "\n")[1]); len(f) < 2 || f[1] != "32" {
		t.Errorf("df of the volume in the guest: %q, want 32 MiB", x.Stdout)
	}
	r = do(t, key, "GET", "/v1/volumes/shared/files?path=/out.txt", nil)
	if r.status != 200 || string(r.body) != "from-guest\n" {
		t.Errorf("the files API reads what the guest closed: %d %q", r.status, r.body)
	}
	// A second sandbox sees the first's file.
	r = do(t, key, "POST", "/v1/sandboxes", map[string]any{"volumes": []any{map[string]any{"name": "shared", "path": "/data", "read_only": true}}})
	expect(t, r, 201, "")
	var sb2 struct{ ID string }
	r.json(t, &sb2)
	x = run(t, key, sb2.ID, map[string]any{"cmd": "cat /data/out.txt; echo x > /data/ro.txt"})
	if !strings.HasPrefix(x.Stdout, "from-guest\n") || x.ExitCode == 0 {
		t.Errorf("read-only mount: %+v, want the file read and the write refused", x)
	}
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb2.ID, nil), 204, "")

	expect(t, do(t, key, "DELETE", "/v1/volumes/shared", nil), 409, "conflict")

	// A branch fork: the child writes its own copy; promote it back.
	r = do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"volume_mode": "branch"})
	expect(t, r, 200, "")
	var forked struct {
		Children []struct {
			Sandbox *struct {
				ID      string
				Volumes []struct{ Name, Path string }
			}
			Error *struct{ Code, Message string }
		}
	}
	r.json(t, &forked)
	if len(forked.Children) != 1 || forked.Children[0].Sandbox == nil {
		t.Fatalf("branch fork: %s", r.body)
	}
	child := forked.Children[0].Sandbox
	branch := "shared-" + child.ID
	if len(child.Volumes) != 1 || child.Volumes[0].Name != branch || child.Volumes[0].Path != "/mnt/shared" {
		t.Errorf("child volumes: %+v, want %s at /mnt/shared", child.Volumes, branch)
	}
	if v := getVolume(t, key, branch); v.Parent != "shared" {
		t.Errorf("branch parent %q, want shared", v.Parent)
	}
	x = run(t, key, child.ID, map[string]any{"cmd": "cat /mnt/shared/out.txt && echo branched > /mnt/shared/out.txt"})
	if x.ExitCode != 0 || x.Stdout != "from-guest\n" {
		t.Errorf("child reads its branch: %+v", x)
	}
	if r := do(t, key, "GET", "/v1/volumes/shared/files?path=/out.txt", nil); string(r.body) != "from-guest\n" {
		t.Errorf("the parent's volume after the child wrote its branch: %q", r.body)
	}
	expect(t, do(t, key, "POST", "/v1/volumes/"+branch+"/promote", nil), 409, "conflict")
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+child.ID, nil), 204, "")
	r = do(t, key, "POST", "/v1/volumes/"+branch+"/promote", nil)
	expect(t, r, 200, "")
	var pv volume
	r.json(t, &pv)
	if pv.Name != "shared" {
		t.Errorf("promote answered %s, want the parent", r.body)
	}
	expect(t, do(t, key, "GET", "/v1/volumes/"+branch, nil), 404, "not_found")
	x = run(t, key, sb.ID, map[string]any{"cmd": "cat /mnt/shared/out.txt"})
	if x.Stdout != "branched\n" {
		t.Errorf("the parent sandbox reads %q after the promote, want the branch's file", x.Stdout)
	}

	// A kill leaves the volume; then it can be deleted.
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	if r := do(t, key, "GET", "/v1/volumes/shared/files?path=/out.txt", nil); string(r.body) != "branched\n" {
		t.Errorf("volume after the kill: %d %q", r.status, r.body)
	}
	expect(t, do(t, key, "DELETE", "/v1/volumes/shared", nil), 204, "")
}

// A purge of a revoked key deletes its volumes, with their files, and
// no other key's.
func TestVolumePurgeKey(t *testing.T) {
	world(t)
	key := newKey(t, "volume-purged", nil)
	other := newKey(t, "volume-kept", nil)
	for _, k := range []string{key, other} {
		expect(t, do(t, k, "POST", "/v1/volumes", map[string]any{"name": "mine", "size_mib": 8}), 201, "")
		expect(t, do(t, k, "PUT", "/v1/volumes/mine/files?path=/f", "x"), 200, "")
	}
	t.Cleanup(func() { do(t, other, "DELETE", "/v1/volumes/mine?force=true", nil) })
	gone := getVolume(t, key, "mine")
	var keys struct{ Keys []struct{ ID, Name string } }
	do(t, e.admin, "GET", "/v1/keys", nil).json(t, &keys)
	id := ""
	for _, k := range keys.Keys {
		if k.Name == "volume-purged" {
			id = k.ID
		}
	}
	expect(t, do(t, e.admin, "DELETE", "/v1/keys/"+id, nil), 204, "")
	r := do(t, e.admin, "POST", "/v1/keys/"+id+"/purge", nil)
	expect(t, r, 200, "")
	var out struct {
		VolumesDeleted int `json:"volumes_deleted"`
		Failed         []any
	}
	r.json(t, &out)
	if out.VolumesDeleted != 1 || len(out.Failed) != 0 {
		t.Errorf("purge: %s, want one volume deleted", r.body)
	}
	if _, err := e.cat.GetVolume(t.Context(), gone.ID); err == nil {
		t.Error("the purged key's volume is still recorded")
	}
	if r := do(t, other, "GET", "/v1/volumes/mine/files?path=/f", nil); r.status != 200 || string(r.body) != "x" {
		t.Errorf("another key's volume after the purge: %d %q", r.status, r.body)
	}
}
