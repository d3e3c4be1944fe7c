package guest

import (
	"bytes"
	"strings"
	"testing"
)

// readAll reads r from off to its end.
func readAll(r *ring, off int64) string {
	var out bytes.Buffer
	buf := make([]byte, 3)
	for {
		n := r.read(off, buf)
		if n == 0 {
			return out.String()
		}
		out.Write(buf[:n])
		off += int64(n)
	}
}

func TestRing(t *testing.T) {
	tests := []struct {
		name      string
		max       int
		writes    []string
		wantStart int64
		wantEnd   int64
		wantKept  string
	}{
		{"empty", 8, nil, 0, 0, ""},
		{"under max", 8, []string{"abc", "de"}, 0, 5, "abcde"},
		{"exactly max", 8, []string{"abcdefgh"}, 0, 8, "abcdefgh"},
		{"wraps", 8, []string{"abcdef", "ghij"}, 2, 10, "cdefghij"},
		{"wraps twice", 4, []string{"ab", "cd", "ef", "gh", "i"}, 5, 9, "fghi"},
		{"one write over max", 4, []string{"abcdefghij"}, 6, 10, "ghij"},
		{"big write after wrap", 4, []string{"abcde", "0123456"}, 8, 12, "3456"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &ring{max: tt.max}
			for _, w := range tt.writes {
				r.write([]byte(w))
			}
			if got := r.start(); got != tt.wantStart {
				t.Errorf("start() = %d, want %d", got, tt.wantStart)
			}
			if r.end != tt.wantEnd {
				t.Errorf("end = %d, want %d", r.end, tt.wantEnd)
			}
			if got := readAll(r, r.start()); got != tt.wantKept {
				t.Errorf("kept %q, want %q", got, tt.wantKept)
			}
			if len(r.buf) > tt.max {
				t.Errorf("buffer of %d bytes, max %d", len(r.buf), tt.max)
			}
		})
	}
}

func TestRingOffsets(t *testing.T) {
	r := &ring{max: 16}
	all := strings.Repeat("0123456789", 5)
	for i := 0; i < len(all); i += 7 {
		r.write([]byte(all[i:min(i+7, len(all))]))
	}
	for off := r.start(); off <= r.end; off++ {
		if got, want := readAll(r, off), all[off:]; got != want {
			t.Errorf("from %d: got %q, want %q", off, got, want)
		}
	}
	if n := r.read(r.start()-1, make([]byte, 4)); n != 0 {
		t.Errorf("read before start gave %d bytes, want 0", n)
	}
}
