package events_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/events"
)

// drain reads what s has buffered without blocking.
func drain(s *events.Sub) []events.Event {
	var out []events.Event
	for {
		select {
		case ev, ok := <-s.Events():
			if !ok {
				return out
			}
			out = append(out, ev)
		default:
			return out
		}
	}
}

func TestFanOutByKey(t *testing.T) {
	at := time.Date(2026, 12, 1, 5, 0, 0, 0, time.FixedZone("x", 3600))
	h := events.New(func() time.Time { return at })
	h.Publish(events.Event{Type: "sandbox", ID: "before", Key: "a"})
	a1, seq, err := h.Subscribe("a", 8)
	if err != nil {
		t.Fatal(err)
	}
	if seq != 1 {
		t.Errorf("seq at subscribe: got %d, want 1", seq)
	}
	a2, _, _ := h.Subscribe("a", 8)
	b, _, _ := h.Subscribe("b", 8)
	h.Publish(events.Event{Type: "sandbox", ID: "x", Key: "a"})
	h.Publish(events.Event{Type: "sandbox_deleted", ID: "y", Key: "b"})
	h.Publish(events.Event{Type: "snapshot", ID: "z", Key: "a"})
	for name, tc := range map[string]struct {
		s    *events.Sub
		want []string
		seqs []uint64
	}{
		"a1": {a1, []string{"x", "z"}, []uint64{2, 4}},
		"a2": {a2, []string{"x", "z"}, []uint64{2, 4}},
		"b":  {b, []string{"y"}, []uint64{3}},
	} {
		got := drain(tc.s)
		if len(got) != len(tc.want) {
			t.Fatalf("%s: got %d events %+v, want %v", name, len(got), got, tc.want)
		}
		for i, ev := range got {
			if ev.ID != tc.want[i] || ev.Seq != tc.seqs[i] || !ev.Time.Equal(at) || ev.Time.Location() != time.UTC {
				t.Errorf("%s event %d: got %+v, want id %s seq %d at %s UTC", name, i, ev, tc.want[i], tc.seqs[i], at)
			}
		}
	}
	if h.Len() != 3 {
		t.Errorf("subscribers: got %d, want 3", h.Len())
	}
}

// A subscriber that does not read is dropped once its buffer is full;
// the others and the publisher go on.
func TestOverflowDropsOnlyTheSlowSubscriber(t *testing.T) {
	h := events.New(nil)
	slow, _, _ := h.Subscribe("k", 4)
	fast, _, _ := h.Subscribe("k", 4)
	var got []uint64
	for i := 0; i < 10; i++ {
		h.Publish(events.Event{Type: "sandbox", ID: "s", Key: "k"})
		for _, ev := range drain(fast) {
			got = append(got, ev.Seq)
		}
	}
	if len(got) != 10 {
		t.Errorf("fast subscriber got %v, want 10 events", got)
	}
	if err := fast.Err(); err != nil {
		t.Errorf("fast subscriber ended: %v", err)
	}
	buffered := drain(slow)
	if len(buffered) != 4 || buffered[3].Seq != 4 {
		t.Errorf("slow subscriber's buffer: got %+v, want events 1-4", buffered)
	}
	if _, ok := <-slow.Events(); ok {
		t.Error("slow subscriber's channel is still open")
	}
	if !errors.Is(slow.Err(), events.ErrOverflow) {
		t.Errorf("slow subscriber: got %v, want ErrOverflow", slow.Err())
	}
	if h.Len() != 1 {
		t.Errorf("subscribers: got %d, want 1", h.Len())
	}
}

func TestCloseKeyCloseAndUnsubscribe(t *testing.T) {
	h := events.New(nil)
	a, _, _ := h.Subscribe("a", 0)
	b, _, _ := h.Subscribe("b", 0)
	c, _, _ := h.Subscribe("b", 0)
	h.CloseKey("a")
	if _, ok := <-a.Events(); ok || !errors.Is(a.Err(), events.ErrRevoked) {
		t.Errorf("revoked key's subscription: open %v, err %v; want closed, ErrRevoked", ok, a.Err())
	}
	c.Close()
	c.Close() // idempotent
	if _, ok := <-c.Events(); ok || h.Len() != 1 {
		t.Errorf("after Close: open %v, %d subscribers; want closed, 1", ok, h.Len())
	}
	h.Close()
	if _, ok := <-b.Events(); ok || !errors.Is(b.Err(), events.ErrClosed) {
		t.Errorf("after hub Close: open %v, err %v; want closed, ErrClosed", ok, b.Err())
	}
	if _, _, err := h.Subscribe("b", 0); !errors.Is(err, events.ErrClosed) {
		t.Errorf("Subscribe after Close: got %v, want ErrClosed", err)
	}
	h.Publish(events.Event{Key: "b"}) // dropped, no panic
	h.Close()
	var nilHub *events.Hub
	nilHub.Publish(events.Event{Key: "b"})
	nilHub.CloseKey("b")
}

// Concurrent publishers and subscribers that come and go: every
// subscriber sees strictly increasing sequence numbers (run with -race).
func TestConcurrent(t *testing.T) {
	h := events.New(nil)
	stop := make(chan struct{})
	var pubs, subs sync.WaitGroup
	for p := 0; p < 4; p++ {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				h.Publish(events.Event{Type: "sandbox", Key: "k"})
			}
		}()
	}
	for c := 0; c < 4; c++ {
		subs.Add(1)
		go func() {
			defer subs.Done()
			for round := 0; round < 20; round++ {
				s, seq, err := h.Subscribe("k", 64)
				if err != nil {
					t.Error(err)
					return
				}
				last := seq
				for i := 0; i < 10; i++ {
					ev, ok := <-s.Events()
					if !ok {
						break // overflowed: fine
					}
					if ev.Seq <= last {
						t.Errorf("seq %d after %d", ev.Seq, last)
					}
					last = ev.Seq
				}
				s.Close()
			}
		}()
	}
	subs.Wait()
	close(stop)
	pubs.Wait()
	if h.Len() != 0 {
		t.Errorf("subscribers left: %d", h.Len())
	}
}
