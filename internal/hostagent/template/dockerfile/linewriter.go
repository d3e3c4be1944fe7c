package dockerfile

import "sync"

// maxLineBytes bounds a progress line of a command's output; the rest of a
// longer line is dropped.
const maxLineBytes = 2000

// lineWriter turns a command's output into progress lines, as they come:
// one per line ("\n" or "\r" ends one), long lines cut, and keeps the last
// few for an error message. It is safe for concurrent writes (a VM may
// write stdout and stderr from two goroutines).
type lineWriter struct {
	emit func(string)
	keep int

	mu   sync.Mutex
	buf  []byte
	cut  bool // the current line was cut: drop the rest of it
	cr   bool // the last byte was a \r
	tail []string
}

func newLineWriter(emit func(string), keep int) *lineWriter {
	return &lineWriter{emit: emit, keep: keep}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range p {
		afterCR := w.cr
		w.cr = c == '\r'
		switch {
		case c == '\n' && afterCR:
			// The \n of a \r\n: the \r ended the line.
		case c == '\n' || c == '\r':
			if !w.cut || len(w.buf) > 0 {
				w.line()
			}
			w.cut = false
		case w.cut:
		case len(w.buf) >= maxLineBytes:
			w.buf = append(w.buf, "…"...)
			w.line()
			w.cut = true
		default:
			w.buf = append(w.buf, c)
		}
	}
	return len(p), nil
}

// line emits the buffered line.
func (w *lineWriter) line() {
	s := string(w.buf)
	w.buf = w.buf[:0]
	w.emit(s)
	w.tail = append(w.tail, s)
	if len(w.tail) > w.keep {
		w.tail = w.tail[1:]
	}
}

// Flush emits a last line that has no newline.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.line()
	}
	w.cut = false
}

// Tail returns the last lines written.
func (w *lineWriter) Tail() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.tail...)
}
