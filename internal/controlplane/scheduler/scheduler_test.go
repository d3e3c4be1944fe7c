package scheduler_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// h is a ready host with 8 CPUs, 32 GiB of which free is free, 100 GiB of
// disk, nothing on it; opts adjust it.
func h(id string, freeGiB float64, opts ...func(*scheduler.Host)) scheduler.Host {
	x := scheduler.Host{
		ID: id, State: scheduler.Ready, CPUs: 8, MemoryMiB: 32 << 10,
		FreeMemoryMiB: int64(freeGiB * 1024), DiskFreeMiB: 100 << 10,
	}
	for _, o := range opts {
		o(&x)
	}
	return x
}

func warm(t ...string) func(*scheduler.Host) {
	return func(x *scheduler.Host) { x.WarmTemplates = t }
}

func state(s scheduler.HostState) func(*scheduler.Host) {
	return func(x *scheduler.Host) { x.State = s }
}

func load(sandboxes, vcpus int) func(*scheduler.Host) {
	return func(x *scheduler.Host) { x.Sandboxes, x.VCPUs = sandboxes, vcpus }
}

func cpus(n int) func(*scheduler.Host) { return func(x *scheduler.Host) { x.CPUs = n } }

func disk(mib int64) func(*scheduler.Host) { return func(x *scheduler.Host) { x.DiskFreeMiB = mib } }

// hostsOf is the chosen hosts in order.
func hostsOf(cs []scheduler.Choice) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Host)
	}
	return out
}

func TestPlace(t *testing.T) {
	base := scheduler.Request{Template: "base", MemoryMiB: 1024, VCPUs: 1}
	with := func(f func(*scheduler.Request)) scheduler.Request {
		r := base
		f(&r)
		return r
	}
	tests := []struct {
		name    string
		req     scheduler.Request
		hosts   []scheduler.Host
		want    []string // hosts chosen
		reasons []string // reasons, if checked
	}{
		{"create: warm template beats more free memory", base,
			[]scheduler.Host{h("a", 20), h("b", 4, warm("tiny", "base"))},
			[]string{"b"}, []string{"template base warm, 4.0 GiB free"}},
		{"create: cold everywhere, most free memory", base,
			[]scheduler.Host{h("a", 4), h("b", 11.2), h("c", 8)},
			[]string{"b"}, []string{"template base cold, 11.2 GiB free"}},
		{"create: free memory compared in whole GiB, then vCPUs per CPU", base,
			[]scheduler.Host{h("a", 11.9, load(4, 16)), h("b", 11.1, load(4, 4))},
			[]string{"b"}, nil},
		{"create: vCPUs per CPU count the host's CPUs", base,
			[]scheduler.Host{h("a", 8, load(2, 8), cpus(2)), h("b", 8, load(2, 8), cpus(16))},
			[]string{"b"}, nil},
		{"create: then sandboxes per CPU", base,
			[]scheduler.Host{h("a", 8, load(8, 8)), h("b", 8, load(2, 8))},
			[]string{"b"}, nil},
		{"create: ties by ID", base,
			[]scheduler.Host{h("b", 8), h("a", 8), h("c", 8)},
			[]string{"a"}, nil},
		{"create: the warm host has no room", base,
			[]scheduler.Host{h("a", 1.1, warm("base")), h("b", 4)},
			[]string{"b"}, []string{"template base warm only on hosts without room, 4.0 GiB free"}},
		{"create: a draining warm host takes nothing", base,
			[]scheduler.Host{h("a", 30, warm("base"), state(scheduler.Draining)), h("b", 4, state(scheduler.Lost)), h("c", 2)},
			[]string{"c"}, []string{"template base cold, 2.0 GiB free"}},
		{"create: no template named", with(func(r *scheduler.Request) { r.Template = "" }),
			[]scheduler.Host{h("a", 4, warm("base")), h("b", 5)},
			[]string{"b"}, []string{"5.0 GiB free"}},
		{"create: pinned user template", with(func(r *scheduler.Request) { r.Template = "myimg:3" }),
			[]scheduler.Host{h("a", 9, warm("myimg:2")), h("b", 5, warm("myimg:3"))},
			[]string{"b"}, []string{"template myimg:3 warm, 5.0 GiB free"}},
		{"create: disk below the minimum", base,
			[]scheduler.Host{h("a", 9, disk(1000)), h("b", 5)},
			[]string{"b"}, nil},
		{"create: vCPU cap", with(func(r *scheduler.Request) { r.VCPUs = 2 }),
			[]scheduler.Host{h("a", 9, cpus(1), load(10, scheduler.MaxVCPUsPerCPU-1)), h("b", 5)},
			[]string{"b"}, nil},
		{"create: several, accounted as they are placed", with(func(r *scheduler.Request) { r.Count = 3 }),
			[]scheduler.Host{h("a", 2.2), h("b", 1.8)},
			// a: 2252 free; one sandbox leaves 1996 (bucket 1) — equal to b's bucket,
			// then b wins on vCPUs per CPU (0 against a's 1), then a again (ties by ID).
			[]string{"a", "b", "a"}, nil},

		{"fork: parent's host", with(func(r *scheduler.Request) { r.ParentHost = "b"; r.Count = 2 }),
			[]scheduler.Host{h("a", 20, warm("base")), h("b", 2)},
			[]string{"b", "b"}, []string{"parent's host", "parent's host"}},
		{"fork: parent's host full, the rest elsewhere", with(func(r *scheduler.Request) { r.ParentHost = "b"; r.Count = 3 }),
			[]scheduler.Host{h("a", 20, warm("base")), h("b", 1.6)}, // room for 2 on b
			[]string{"b", "b", "a"}, []string{"parent's host", "parent's host",
				"parent's host b has no room (1.6 GiB free memory, needs 1.8 GiB); template base warm, 20.0 GiB free"}},
		{"fork: parent's host draining", with(func(r *scheduler.Request) { r.ParentHost = "b" }),
			[]scheduler.Host{h("a", 20), h("b", 20, state(scheduler.Draining))},
			[]string{"a"}, []string{"parent's host b is draining; template base cold, 20.0 GiB free"}},
		{"fork: parent's host unknown", with(func(r *scheduler.Request) { r.ParentHost = "gone" }),
			[]scheduler.Host{h("a", 20)},
			[]string{"a"}, []string{"parent's host gone is unknown; template base cold, 20.0 GiB free"}},
		{"fork: small guests count what they are", with(func(r *scheduler.Request) { r.ParentHost = "a"; r.MemoryMiB = 128; r.Count = 4 }),
			[]scheduler.Host{h("a", 1.5), h("b", 20)}, // 1536-1024 = 512 = 4 × 128
			[]string{"a", "a", "a", "a"}, nil},

		{"named host", with(func(r *scheduler.Request) {
			r.Placement = scheduler.Placement{Host: "a"}
			r.ParentHost = "b"
			r.Count = 2
		}),
			[]scheduler.Host{h("a", 2), h("b", 20, warm("base"))},
			[]string{"a", "a"}, []string{"asked for", "asked for"}},

		{"spread: fork, parent's host first, then by score", with(func(r *scheduler.Request) {
			r.Placement = scheduler.Placement{Spread: true}
			r.ParentHost = "c"
			r.Count = 5
		}),
			[]scheduler.Host{h("a", 4), h("b", 8, warm("base")), h("c", 2), h("d", 30, state(scheduler.Lost))},
			[]string{"c", "b", "a", "c", "b"}, []string{"spread 1/3", "spread 2/3", "spread 3/3", "spread 1/3", "spread 2/3"}},
		{"spread: a full host is skipped", with(func(r *scheduler.Request) {
			r.Placement = scheduler.Placement{Spread: true}
			r.ParentHost = "a"
			r.Count = 5
		}),
			[]scheduler.Host{h("a", 1.3), h("b", 8)}, // a has room for one
			[]string{"a", "b", "b", "b", "b"}, nil},
		{"spread: a create", with(func(r *scheduler.Request) { r.Placement = scheduler.Placement{Spread: true} }),
			[]scheduler.Host{h("a", 4), h("b", 8)},
			[]string{"b"}, []string{"spread 1/2"}},
		{"spread: the parent's host has no room", with(func(r *scheduler.Request) {
			r.Placement = scheduler.Placement{Spread: true}
			r.ParentHost = "a"
			r.Count = 2
		}),
			[]scheduler.Host{h("a", 1), h("b", 8), h("c", 4)},
			[]string{"b", "c"}, []string{"spread 1/2", "spread 2/2"}},
		{"count 0 is one", with(func(r *scheduler.Request) { r.Count = 0 }),
			[]scheduler.Host{h("a", 4)},
			[]string{"a"}, nil},
		{"a host without an ID is ignored", base,
			[]scheduler.Host{h("", 30), h("b", 2)},
			[]string{"b"}, nil},
		{"duplicate IDs: the first counts", base,
			[]scheduler.Host{h("a", 1, state(scheduler.Draining)), h("a", 30), h("b", 2)},
			[]string{"b"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(tt.hosts)
			got, err := scheduler.Place(tt.req, tt.hosts)
			if err != nil {
				t.Fatalf("got error %v", err)
			}
			if g := hostsOf(got); !slices.Equal(g, tt.want) {
				t.Errorf("got hosts %q, want %q (reasons %q)", g, tt.want, got)
			}
			if tt.reasons != nil {
				var rs []string
				for _, c := range got {
					rs = append(rs, c.Reason)
				}
				if !slices.Equal(rs, tt.reasons) {
					t.Errorf("got reasons %q, want %q", rs, tt.reasons)
				}
			}
			if !slices.EqualFunc(in, tt.hosts, func(a, b scheduler.Host) bool { return fmt.Sprint(a) == fmt.Sprint(b) }) {
				t.Errorf("Place modified its hosts")
			}
			again, _ := scheduler.Place(tt.req, tt.hosts)
			if !slices.Equal(again, got) {
				t.Errorf("second call got %q, first %q", again, got)
			}
		})
	}
}

func TestPlaceErrors(t *testing.T) {
	base := scheduler.Request{Template: "base", MemoryMiB: 1024, VCPUs: 1}
	with := func(f func(*scheduler.Request)) scheduler.Request {
		r := base
		f(&r)
		return r
	}
	on := func(id string) func(*scheduler.Request) {
		return func(r *scheduler.Request) { r.Placement = scheduler.Placement{Host: id} }
	}
	fleet := []scheduler.Host{h("a", 20), h("b", 20, state(scheduler.Draining)), h("c", 20, state(scheduler.Lost)), h("d", 1.1)}
	tests := []struct {
		name  string
		req   scheduler.Request
		hosts []scheduler.Host
		class error
		msg   string // the whole message
	}{
		{"unknown host", with(on("zz")), fleet, scheduler.ErrUnknownHost,
			`unknown host "zz" (ready hosts: a, d)`},
		{"draining host", with(on("b")), fleet, scheduler.ErrHostNotReady,
			`host b is draining: it takes no new sandboxes (ready hosts: a, d)`},
		{"lost host", with(on("c")), fleet, scheduler.ErrHostNotReady,
			`host c is lost: it takes no new sandboxes (ready hosts: a, d)`},
		{"named host without memory", with(on("d")), fleet, scheduler.ErrNoCapacity,
			`host d has no room for a sandbox (1 vCPU, counted as 256 MiB of memory): 1.1 GiB free memory, needs 1.2 GiB`},
		{"named host with room for some", with(func(r *scheduler.Request) { on("a")(r); r.Count = 3; r.VCPUs = 8 }),
			[]scheduler.Host{h("a", 20, cpus(1), load(3, 42))}, scheduler.ErrNoCapacity,
			`host a has room for 2 of 3 sandboxes (8 vCPUs, counted as 256 MiB of memory each): 58 of its 64 vCPUs in use, needs 8 more`},
		{"no hosts", base, nil, scheduler.ErrNoCapacity,
			`no host has room for a sandbox (1 vCPU, counted as 256 MiB of memory): there are no hosts`},
		{"no host with room", base, []scheduler.Host{h("b", 20, state(scheduler.Draining)), h("d", 1.1), h("e", 9, disk(1050))}, scheduler.ErrNoCapacity,
			`no host has room for a sandbox (1 vCPU, counted as 256 MiB of memory): b: draining; d: 1.1 GiB free memory, needs 1.2 GiB; e: 1.0 GiB free disk, needs 1.1 GiB`},
		{"fork runs out on the third child", with(func(r *scheduler.Request) { r.Count = 3; r.ParentHost = "d" }),
			[]scheduler.Host{h("a", 1.3), h("d", 1.3)}, scheduler.ErrNoCapacity,
			`no host has room for sandbox 3 of 3 (1 vCPU, counted as 256 MiB of memory each): a: 1.3 GiB free memory, needs 1.5 GiB; d: 1.3 GiB free memory, needs 1.5 GiB`},
		{"spread runs out", with(func(r *scheduler.Request) { r.Count = 3; r.Placement.Spread = true }),
			[]scheduler.Host{h("a", 1.3), h("d", 1.3)}, scheduler.ErrNoCapacity,
			`no host has room for sandbox 3 of 3 (1 vCPU, counted as 256 MiB of memory each): a: 1.3 GiB free memory, needs 1.5 GiB; d: 1.3 GiB free memory, needs 1.5 GiB`},
		{"spread with no ready host", with(func(r *scheduler.Request) { r.Placement.Spread = true }),
			[]scheduler.Host{h("b", 20, state(scheduler.Draining))}, scheduler.ErrNoCapacity,
			`no host has room for a sandbox (1 vCPU, counted as 256 MiB of memory): b: draining`},
		{"negative count", with(func(r *scheduler.Request) { r.Count = -1 }), fleet, scheduler.ErrInvalid,
			`cannot place -1 sandboxes at once (at most 1024)`},
		{"count over the max", with(func(r *scheduler.Request) { r.Count = scheduler.MaxCount + 1 }), fleet, scheduler.ErrInvalid,
			`cannot place 1025 sandboxes at once (at most 1024)`},
		{"host and spread", with(func(r *scheduler.Request) { r.Placement = scheduler.Placement{Host: "a", Spread: true} }), fleet, scheduler.ErrInvalid,
			`placement names host "a" and asks to spread: choose one`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := scheduler.Place(tt.req, tt.hosts)
			if !errors.Is(err, tt.class) {
				t.Fatalf("got %q, %v; want an error of class %v", got, err, tt.class)
			}
			if got != nil {
				t.Errorf("got choices %q with the error, want none", got)
			}
			if err.Error() != tt.msg {
				t.Errorf("got message\n%s\nwant\n%s", err, tt.msg)
			}
		})
	}
}

// TestNoCapacityListsAtMostEight: the message of a big fleet stays short.
func TestNoCapacityListsAtMostEight(t *testing.T) {
	var hosts []scheduler.Host
	for i := range 20 {
		hosts = append(hosts, h(fmt.Sprintf("h%02d", i), 0.5))
	}
	_, err := scheduler.Place(scheduler.Request{}, hosts)
	if !errors.Is(err, scheduler.ErrNoCapacity) || !strings.HasSuffix(err.Error(), "h07: 512 MiB free memory, needs 1.2 GiB; and 12 more") {
		t.Errorf("got %v", err)
	}
	_, err = scheduler.Place(scheduler.Request{Placement: scheduler.Placement{Host: "x"}}, hosts)
	if !errors.Is(err, scheduler.ErrUnknownHost) || !strings.HasSuffix(err.Error(), "h07 and 12 more)") {
		t.Errorf("got %v", err)
	}
}

// TestSpreadCoversHosts: spread children use every ready host before any
// host gets a second one.
func TestSpreadCoversHosts(t *testing.T) {
	hosts := []scheduler.Host{h("a", 8), h("b", 8), h("c", 8), h("d", 8, state(scheduler.Draining))}
	got, err := scheduler.Place(scheduler.Request{Count: 3, ParentHost: "b", Placement: scheduler.Placement{Spread: true}}, hosts)
	if err != nil {
		t.Fatal(err)
	}
	if g, want := hostsOf(got), []string{"b", "a", "c"}; !slices.Equal(g, want) {
		t.Errorf("got %q, want %q", g, want)
	}
}
