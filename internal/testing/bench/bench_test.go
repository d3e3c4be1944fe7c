package bench

import (
	"testing"
	"time"
)

// TestTailName: a distribution of fewer than 100 samples has no 99th
// percentile apart from its maximum, and output says "max" for it.
func TestTailName(t *testing.T) {
	for _, tc := range []struct {
		n        int
		name     string
		p99IsMax bool
	}{{1, "max", true}, {50, "max", true}, {99, "max", true}, {100, "p99", false}, {1000, "p99", false}} {
		ds := make([]time.Duration, tc.n)
		for i := range ds {
			ds[i] = time.Duration(i+1) * time.Millisecond
		}
		d := Summarize(ds)
		if got := d.TailName(); got != tc.name {
			t.Errorf("n=%d: TailName = %q, want %q", tc.n, got, tc.name)
		}
		if (d.P99 == d.Max) != tc.p99IsMax {
			t.Errorf("n=%d: P99 %v, Max %v: want them equal %v", tc.n, d.P99, d.Max, tc.p99IsMax)
		}
		if got := (LatencyUS{N: tc.n}).TailName(); got != tc.name {
			t.Errorf("n=%d: LatencyUS.TailName = %q, want %q", tc.n, got, tc.name)
		}
	}
}
