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

// problemLines keeps the last problemMax lines written to it that a
// logger marked as warnings or errors (slog's text and JSON handlers), so
// that a failure report shows them even when they have left the tail.
type problemLines struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
}

const (
	problemMax     = 40
	problemLineMax = 600
)

func (p *problemLines) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			break
		}
		if line := p.partial[:i]; isProblem(line) {
			if len(line) > problemLineMax {
				line = append(line[:problemLineMax:problemLineMax], "…"...)
			}
			p.lines = append(p.lines, string(line))
			if len(p.lines) > problemMax {
				p.lines = p.lines[len(p.lines)-problemMax:]
			}
		}
		p.partial = p.partial[i+1:]
	}
	if len(p.partial) > 64<<10 { // a line that never ends is not a log line
		p.partial = p.partial[:0]
	}
	return len(b), nil
}

func isProblem(line []byte) bool {
	for _, m := range [][]byte{[]byte("level=ERROR"), []byte("level=WARN"), []byte(`"level":"ERROR"`), []byte(`"level":"WARN"`)} {
		if bytes.Contains(line, m) {
			return true
		}
	}
	return false
}

// Lines is a copy of the lines kept, oldest first.
func (p *problemLines) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}
