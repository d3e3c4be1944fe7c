package scheduler_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// fuzzHosts decodes hosts from data, 12 bytes each: ID (one of 10, so IDs
// repeat), state, CPUs, free memory, disk, sandboxes, vCPUs, warm
// templates. Values reach past the edges (negative, huge) on purpose.
func fuzzHosts(data []byte) []scheduler.Host {
	var hosts []scheduler.Host
	states := []scheduler.HostState{scheduler.Ready, scheduler.Ready, scheduler.Draining, scheduler.Lost, ""}
	for len(data) >= 12 {
		b := data[:12]
		data = data[12:]
		h := scheduler.Host{
			ID:            fmt.Sprintf("h%d", b[0]%10),
			State:         states[int(b[1])%len(states)],
			CPUs:          int(int8(b[2])),
			FreeMemoryMiB: int64(int16(binary.LittleEndian.Uint16(b[3:]))) * 4,
			DiskFreeMiB:   int64(int16(binary.LittleEndian.Uint16(b[5:]))) * 4,
			Sandboxes:     int(int8(b[7])),
			VCPUs:         int(int16(binary.LittleEndian.Uint16(b[8:]))),
		}
		switch b[10] % 4 {
		case 1:
			h.WarmTemplates = []string{"base"}
		case 2:
			h.WarmTemplates = []string{"tiny", "base"}
		case 3:
			h.WarmTemplates = []string{""}
		}
		if b[11] == 0xff { // the extremes
			h.CPUs, h.FreeMemoryMiB, h.DiskFreeMiB, h.VCPUs, h.Sandboxes = 1<<62, 1<<62, 1<<62, -1<<62, 1<<62
		}
		if b[11] == 0xfe {
			h.CPUs, h.FreeMemoryMiB, h.DiskFreeMiB, h.VCPUs, h.Sandboxes = -1<<62, -1<<62, -1<<62, 1<<62, -1<<62
		}
		hosts = append(hosts, h)
	}
	return hosts
}

// FuzzPlace: Place never panics, is deterministic, and honours its
// invariants: only ready hosts, len == Count, a named host or an error,
// no host past its room, errors of the documented classes.
func FuzzPlace(f *testing.F) {
	f.Add([]byte("\x01\x00\x08\x00\x10\x00\x40\x00\x00\x00\x01\x00\x02\x00\x08\x00\x08\x00\x40\x00\x00\x00\x00\x00"), 3, 1024, 1, "h1", "", false, "base")
	f.Add([]byte("\x01\x00\x08\x00\x10\x00\x40\x00\x00\x00\x01\x00\x02\x00\x08\x00\x08\x00\x40\x00\x00\x00\x00\x00"), 5, 512, 2, "h1", "", true, "base")
	f.Add([]byte("\x01\x00\x08\x00\x10\x00\x40\x00\x00\x00\x01\x00\x02\x02\x08\x00\x08\x00\x40\x00\x00\x00\x00\x00"), 1, 0, 0, "", "h2", false, "tiny")
	f.Add([]byte("\x01\x00\x08\x00\x10\x00\x40\x00\x00\x00\x01\xff"), 2, 1<<40, 1<<40, "h1", "h1", false, "")
	f.Add([]byte{}, 0, 0, 0, "", "", false, "")
	f.Fuzz(func(t *testing.T, data []byte, count, memory, vcpus int, parent, named string, spread bool, template string) {
		hosts := fuzzHosts(data)
		count %= scheduler.MaxCount + 8 // bounded work; a few past the max
		req := scheduler.Request{
			Template: template, MemoryMiB: memory, VCPUs: vcpus, Count: count, ParentHost: parent,
			Placement: scheduler.Placement{Host: named, Spread: spread},
		}
		got, err := scheduler.Place(req, hosts)
		again, err2 := scheduler.Place(req, hosts)
		if !slices.Equal(got, again) || fmt.Sprint(err) != fmt.Sprint(err2) {
			t.Fatalf("not deterministic: %q, %v then %q, %v", got, err, again, err2)
		}
		first := map[string]scheduler.Host{}
		for _, h := range hosts {
			if _, ok := first[h.ID]; !ok {
				first[h.ID] = h
			}
		}
		if err != nil {
			if got != nil {
				t.Fatalf("error %v with choices %q", err, got)
			}
			classes := 0
			for _, c := range []error{scheduler.ErrUnknownHost, scheduler.ErrHostNotReady, scheduler.ErrNoCapacity, scheduler.ErrInvalid} {
				if errors.Is(err, c) {
					classes++
				}
			}
			if classes != 1 || err.Error() == "" {
				t.Fatalf("error %q is of %d classes, want 1", err, classes)
			}
			if named != "" && !spread {
				h, known := first[named]
				if !known != errors.Is(err, scheduler.ErrUnknownHost) && count >= 0 && count <= scheduler.MaxCount {
					t.Fatalf("named host %q (known %v): got %v", named, known, err)
				}
				if known && (h.State != scheduler.Ready) != errors.Is(err, scheduler.ErrHostNotReady) && count >= 0 && count <= scheduler.MaxCount {
					t.Fatalf("named host %q (state %q): got %v", named, h.State, err)
				}
			}
			return
		}
		want := max(count, 1)
		if count < 0 || count > scheduler.MaxCount || (named != "" && spread) {
			t.Fatalf("an invalid request (count %d, placement %+v) was placed: %q", count, req.Placement, got)
		}
		if len(got) != want {
			t.Fatalf("got %d choices, want %d", len(got), want)
		}
		placed := map[string]int64{}
		for _, c := range got {
			h, ok := first[c.Host]
			if !ok || h.State != scheduler.Ready {
				t.Fatalf("chose %q (known %v, state %q)", c.Host, ok, h.State)
			}
			if named != "" && c.Host != named {
				t.Fatalf("asked for %q, got %q", named, c.Host)
			}
			if c.Reason == "" {
				t.Fatalf("choice %q has no reason", c.Host)
			}
			placed[c.Host]++
		}
		est := int64(scheduler.EstimateMiB)
		if memory > 0 && memory < scheduler.EstimateMiB {
			est = int64(memory)
		}
		v := int64(max(min(vcpus, 1<<20), 1))
		for id, n := range placed {
			h := first[id]
			// Hosts of the extreme kind are clamped; only ordinary ones are checked here.
			if h.FreeMemoryMiB < 1<<40 && h.FreeMemoryMiB-scheduler.ReserveMiB < n*est {
				t.Fatalf("%d sandboxes on %s (free %d MiB, estimate %d)", n, id, h.FreeMemoryMiB, est)
			}
			if h.CPUs > 0 && h.CPUs < 1<<20 && int64(h.VCPUs) >= 0 && int64(h.VCPUs)+n*v > int64(scheduler.MaxVCPUsPerCPU*h.CPUs) {
				t.Fatalf("%d sandboxes of %d vCPUs on %s (%d vCPUs on %d CPUs)", n, v, id, h.VCPUs, h.CPUs)
			}
			if h.DiskFreeMiB < 1<<40 && h.DiskFreeMiB-scheduler.MinDiskFreeMiB < n*scheduler.DiskEstimateMiB {
				t.Fatalf("%d sandboxes on %s (disk free %d MiB)", n, id, h.DiskFreeMiB)
			}
		}
	})
}
