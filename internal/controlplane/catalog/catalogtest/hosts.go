package catalogtest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

func testHosts(t *testing.T, c catalog.Catalog) {
	ctx := t.Context()
	hosts := []catalog.Host{
		{ID: "h2", URL: "https://10.0.0.2:7789", Token: "secret-2", CACert: "-----BEGIN CERTIFICATE-----\nx\n", State: catalog.HostReady,
			Capacity:     catalog.HostCapacity{CPUs: 64, MemoryMiB: 512 << 10, DiskMiB: 4 << 20, Accel: "kvm"},
			RegisteredAt: t0.In(elsewhere), HeartbeatAt: t0.Add(time.Second)},
		{ID: "h1", URL: "https://10.0.0.1:7789", Token: "secret-1", State: catalog.HostLost, Draining: true, RegisteredAt: t0},
	}
	for _, h := range hosts {
		if err := c.PutHost(ctx, h); err != nil {
			t.Fatalf("PutHost(%s): %v", h.ID, err)
		}
	}
	for _, h := range hosts {
		got, err := c.GetHost(ctx, h.ID)
		if err != nil {
			t.Fatalf("GetHost(%s): %v", h.ID, err)
		}
		if d := diff(got, stored(h)); d != "" {
			t.Errorf("GetHost(%s): %s", h.ID, d)
		}
	}
	if hs, err := c.ListHosts(ctx); err != nil || strings.Join(ids(hs), ",") != "h1,h2" {
		t.Errorf("ListHosts = %v, %v; want h1,h2", ids(hs), err)
	}
	// PutHost replaces.
	re := hosts[1]
	re.URL, re.State, re.Draining = "https://10.0.0.9:7789", catalog.HostReady, false
	if err := c.PutHost(ctx, re); err != nil {
		t.Fatalf("PutHost again: %v", err)
	}
	if got, err := c.GetHost(ctx, "h1"); err != nil || diff(got, stored(re)) != "" {
		t.Errorf("GetHost after a second PutHost: %+v, %v; want %+v", got, err, re)
	}
	beat := t0.Add(time.Hour).Truncate(time.Microsecond)
	got, err := c.UpdateHost(ctx, "h2", func(h *catalog.Host) error {
		h.HeartbeatAt, h.State = beat, catalog.HostDraining
		return nil
	})
	if err != nil || !got.HeartbeatAt.Equal(beat) || got.State != catalog.HostDraining || got.Token != "secret-2" {
		t.Errorf("UpdateHost = %+v, %v", got, err)
	}
	if got, err := c.GetHost(ctx, "h2"); err != nil || !got.HeartbeatAt.Equal(beat) || got.Capacity.CPUs != 64 {
		t.Errorf("GetHost after UpdateHost = %+v, %v", got, err)
	}
	errFn := errors.New("no")
	if _, err := c.UpdateHost(ctx, "h2", func(h *catalog.Host) error { h.URL = "x"; return errFn }); err != errFn {
		t.Errorf("UpdateHost whose fn fails: got %v, want fn's error unwrapped", err)
	}
	if got, _ := c.GetHost(ctx, "h2"); got.URL != hosts[0].URL {
		t.Errorf("UpdateHost whose fn failed wrote %q", got.URL)
	}
	if _, err := c.UpdateHost(ctx, "nope", func(*catalog.Host) error { return nil }); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("UpdateHost(unknown): got %v, want ErrNotFound", err)
	}
	if err := c.DeleteHost(ctx, "h1"); err != nil {
		t.Fatalf("DeleteHost: %v", err)
	}
	if _, err := c.GetHost(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("GetHost after DeleteHost: got %v, want ErrNotFound", err)
	}
	if err := c.DeleteHost(ctx, "h1"); !errors.Is(err, catalog.ErrNotFound) {
		t.Errorf("DeleteHost twice: got %v, want ErrNotFound", err)
	}
}
