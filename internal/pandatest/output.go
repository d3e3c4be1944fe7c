package pandatest

import (
	"bytes"
	"sync"
)

// headBuffer keeps the first MiB written to it.
type headBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

const headMax = 1 << 20

func (h *headBuffer) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := headMax - h.b.Len(); room > 0 {
		h.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (h *headBuffer) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.b.String()
}

// tailBuffer keeps at least the last tailMax bytes written to it.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

const tailMax = 64 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > 2*tailMax {
		t.b = append(t.b[:0], t.b[len(t.b)-tailMax:]...)
	}
	return len(p), nil
}

// Tail is the last n bytes, with "..." before them if there was more.
func (t *tailBuffer) Tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.b) > n {
		return "..." + string(t.b[len(t.b)-n:])
	}
	return string(t.b)
}
