package catalogtest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func testQuota(t *testing.T, c catalog.Catalog) {
	type held struct {
		mem   int
		state string
	}
	tests := []struct {
		name       string
		mine       []held // the key's sandboxes before the reservation
		others     []held // another key's
		maxCount   int
		maxMem     int
		reqMem     int
		wantLimit  string // "" = accepted
		wantUsed   int
		wantMaxNum int
	}{
		{name: "unlimited", mine: []held{{1024, "running"}, {1024, "running"}, {1024, "paused"}}, reqMem: 4096},
		{name: "negative is unlimited", mine: []held{{1024, "running"}}, maxCount: -1, maxMem: -1, reqMem: 4096},
		{name: "below count", mine: []held{{512, "running"}}, maxCount: 2, reqMem: 512},
		{name: "at count", mine: []held{{512, "running"}, {512, "starting"}}, maxCount: 2, reqMem: 512,
			wantLimit: catalog.QuotaSandboxes, wantUsed: 2, wantMaxNum: 2},
		{name: "paused counts", mine: []held{{512, "paused"}}, maxCount: 1, reqMem: 512,
			wantLimit: catalog.QuotaSandboxes, wantUsed: 1, wantMaxNum: 1},
		{name: "stopped do not count", mine: []held{{512, "stopped"}, {512, "stopped"}, {4096, "stopped"}},
			maxCount: 1, maxMem: 512, reqMem: 512},
		{name: "other keys do not count", others: []held{{512, "running"}, {512, "running"}},
			maxCount: 1, maxMem: 512, reqMem: 512},
		{name: "memory up to the limit", mine: []held{{1024, "running"}, {1024, "paused"}}, maxMem: 3072, reqMem: 1024},
		{name: "memory over the limit", mine: []held{{1024, "running"}, {1024, "paused"}}, maxMem: 3072, reqMem: 1025,
			wantLimit: catalog.QuotaMemory, wantUsed: 2048, wantMaxNum: 3072},
		{name: "memory alone over the limit", maxMem: 1024, reqMem: 2048,
			wantLimit: catalog.QuotaMemory, wantUsed: 0, wantMaxNum: 1024},
		{name: "stopped memory does not count", mine: []held{{8192, "stopped"}}, maxMem: 1024, reqMem: 1024},
	}
	ctx := t.Context()
	for i, tc := range tests {
		// One catalog for all cases: each case has its own keys.
		mine, other := fmt.Sprintf("key_mine%d", i), fmt.Sprintf("key_other%d", i)
		createKey(t, c, newKey(mine, t0))
		createKey(t, c, newKey(other, t0))
		for j, h := range tc.mine {
			sb := newSandbox(fmt.Sprintf("q%dmine%d", i, j), mine)
			sb.MemoryMiB, sb.State = h.mem, h.state
			reserve(t, c, sb)
		}
		for j, h := range tc.others {
			sb := newSandbox(fmt.Sprintf("q%dother%d", i, j), other)
			sb.MemoryMiB, sb.State = h.mem, h.state
			reserve(t, c, sb)
		}
		sb := newSandbox(fmt.Sprintf("q%dnew", i), mine)
		sb.MemoryMiB = tc.reqMem
		err := c.ReserveSandbox(ctx, sb, catalog.Limits{Sandboxes: tc.maxCount, MemoryMiB: tc.maxMem})
		_, getErr := c.GetSandbox(ctx, sb.ID)
		if tc.wantLimit == "" {
			if err != nil {
				t.Errorf("%s: ReserveSandbox: %v, want success", tc.name, err)
			} else if getErr != nil {
				t.Errorf("%s: GetSandbox after ReserveSandbox: %v", tc.name, getErr)
			}
			continue
		}
		var qe *catalog.QuotaError
		if !errors.Is(err, catalog.ErrQuota) || !errors.As(err, &qe) {
			t.Errorf("%s: ReserveSandbox: got %v, want a QuotaError", tc.name, err)
			continue
		}
		want := catalog.QuotaError{KeyID: mine, Limit: tc.wantLimit, Used: tc.wantUsed, Max: tc.wantMaxNum, Requested: 1}
		if tc.wantLimit == catalog.QuotaMemory {
			want.Requested = tc.reqMem
		}
		if *qe != want {
			t.Errorf("%s: QuotaError = %+v, want %+v", tc.name, *qe, want)
		}
		for _, n := range []int{want.Used, want.Max} {
			if !strings.Contains(err.Error(), strconv.Itoa(n)) {
				t.Errorf("%s: error %q does not say %d", tc.name, err, n)
			}
		}
		if !errors.Is(getErr, catalog.ErrNotFound) {
			t.Errorf("%s: GetSandbox after a refused reservation: got %v, want ErrNotFound", tc.name, getErr)
		}
	}
}

// vCPUs and disk count like memory; disk counts sandbox disks, pause
// captures and snapshots, and CreateSnapshot checks it too.
func testQuotaVCPUsAndDisk(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	createKey(t, c, newKey("key_a", t0))
	createKey(t, c, newKey("key_b", t0))
	held := newSandbox("held", "key_a")
	held.VCPUs, held.DiskMiB, held.State, held.PausedBytes = 3, 1000, catalog.StatePaused, 100<<20+1 // counts 101 MiB
	gone := newSandbox("gone", "key_a")
	gone.VCPUs, gone.DiskMiB, gone.State = 16, 100000, catalog.StateStopped
	other := newSandbox("other", "key_b")
	other.VCPUs, other.DiskMiB = 16, 100000
	reserve(t, c, held, gone, other)
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapa", KeyID: "key_a", SizeBytes: 200 << 20, CreatedAt: t0}, catalog.Limits{}); err != nil {
		t.Fatal(err)
	}
	// key_a holds 3 vCPUs and 1000 + 101 + 200 = 1301 MiB of disk.
	tests := []struct {
		name      string
		vcpus     int
		disk      int
		lim       catalog.Limits
		wantLimit string
		wantUsed  int
	}{
		{"vcpus fit", 1, 0, catalog.Limits{VCPUs: 4}, "", 0},
		{"vcpus over", 2, 0, catalog.Limits{VCPUs: 4}, catalog.QuotaVCPUs, 3},
		{"disk fits", 1, 99, catalog.Limits{DiskMiB: 1400}, "", 0},
		{"disk over", 1, 100, catalog.Limits{DiskMiB: 1400}, catalog.QuotaDisk, 1301},
	}
	for i, tc := range tests {
		sb := newSandbox(fmt.Sprintf("vd%d", i), "key_a")
		sb.VCPUs, sb.DiskMiB = tc.vcpus, tc.disk
		err := c.ReserveSandbox(ctx, sb, tc.lim)
		if tc.wantLimit == "" {
			if err != nil {
				t.Errorf("%s: %v, want success", tc.name, err)
			}
			c.DeleteSandbox(ctx, sb.ID)
			continue
		}
		var qe *catalog.QuotaError
		if !errors.As(err, &qe) || qe.Limit != tc.wantLimit || qe.Used != tc.wantUsed {
			t.Errorf("%s: got %v (%+v), want a %s QuotaError with %d used", tc.name, err, qe, tc.wantLimit, tc.wantUsed)
		}
	}
	// A snapshot that would pass the disk limit is refused and not stored.
	err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapb", KeyID: "key_a", SizeBytes: 100 << 20, CreatedAt: t0}, catalog.Limits{DiskMiB: 1400})
	var qe *catalog.QuotaError
	if !errors.As(err, &qe) || qe.Limit != catalog.QuotaDisk || qe.Used != 1301 || qe.Requested != 100 {
		t.Errorf("CreateSnapshot over the disk limit: %v (%+v), want a disk QuotaError, 1301 used, 100 requested", err, qe)
	}
	if _, err := c.GetSnapshot(ctx, "snapb"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("refused snapshot stored: %v", err)
	}
	if err := c.CreateSnapshot(ctx, catalog.Snapshot{ID: "snapc", KeyID: "key_a", SizeBytes: 99 << 20, CreatedAt: t0}, catalog.Limits{DiskMiB: 1400}); err != nil {
		t.Errorf("CreateSnapshot within the disk limit: %v", err)
	}
}
