package daemon

import "testing"

func TestFreeMemoryMiB(t *testing.T) {
	gib := func(n int64) int64 { return n << 30 }
	tests := []struct {
		name          string
		avail         int64
		offered       int
		inUse         int64
		want          int64
		wantsTheInUse bool
	}{
		{"the machine's: MemAvailable as it is", 20000, 0, 0, 20000, false},
		{"offered, nothing running", 20000, 8192, 0, 8192, true},
		{"offered, machines hold 3 GiB", 20000, 8192, gib(3), 8192 - 3072, true},
		{"the machine has less than what is left", 4000, 8192, gib(1), 4000, true},
		{"machines hold more than offered", 20000, 2048, gib(3), 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked := false
			got := freeMemoryMiB(tt.avail, tt.offered, func() int64 { asked = true; return tt.inUse })
			if got != tt.want {
				t.Errorf("freeMemoryMiB(%d, %d, %d B) = %d, want %d", tt.avail, tt.offered, tt.inUse, got, tt.want)
			}
			if asked != tt.wantsTheInUse {
				t.Errorf("asked for the memory in use: %v, want %v (it reads every machine's)", asked, tt.wantsTheInUse)
			}
		})
	}
}
