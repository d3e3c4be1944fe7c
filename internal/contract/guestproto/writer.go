package guestproto

import (
	"bufio"
	"io"
	"sync"
)

// gateOp is how writing a frame changes the barrier gate.
type gateOp uint8

const (
	gateNone  gateOp = iota
	gateClose        // after this frame, write nothing until gateOpen or reset
	gateOpen         // written even while gated, and reopens the gate
)

// outFrame is a frame waiting in the writer's queue: a session frame or a
// stream frame other than DATA. DATA never waits in a queue: the writer takes
// it from the stream when it writes it (see readyChan).
type outFrame struct {
	f    Frame
	gen  uint64
	gate gateOp
	// done, if not nil, receives the outcome of the write, once the frame
	// is flushed to the transport. It must have room for the value.
	done chan error
}

// readyChan names a stream channel that has DATA waiting in a blocked
// Write and credit to send some of it.
type readyChan struct {
	s  *Stream
	ch int
}

var payloadPool = sync.Pool{New: func() any { b := make([]byte, MaxPayload); return &b }}

// frameWriter owns the write side of the transport: one goroutine (run)
// writes frames, so a frame is never interleaved with another and no reader
// ever blocks on the transport.
//
// What it writes, in priority order: control frames (WINDOW, RESET, session
// frames), then the other stream frames (OPEN, REPLY, EXIT, CLOSE) in the
// order they were queued, then DATA. DATA is pulled: a stream's Write parks
// its buffer on the stream and registers the channel as ready (once, while it
// has credit); run takes up to one frame's worth from it, charging the
// stream's credit at that moment, copies it into its own buffer and writes
// it, then moves the channel to the back of the ready list (round robin). So
// credit is charged when bytes go to the transport, a writer that outpaces
// the transport waits in Write, and memory held for outgoing DATA is one
// frame, however many streams write. The queues hold only frames that exist
// once or a few times per stream (OPEN, CLOSE, RESET, REPLY, EXIT, WINDOW
// grants, which a receiver only sends for DATA it consumed) or per caller
// waiting on them (HELLO, BARRIER, PING), so they are bounded by the number
// of streams and callers.
//
// The gate implements BARRIER: once a gateClose frame is written, nothing but
// a gateOpen frame is written until ungate or reset.
//
// Every queued frame and stream carries the session generation it belongs
// to; reset bumps the generation and drops those of older ones.
//
// Lock order: Stream.mu before frameWriter.mu; run holds neither while it
// writes, and never takes a stream's mu while holding its own.
type frameWriter struct {
	target io.Writer
	bw     *bufio.Writer
	buf    []byte // the DATA payload being written; owned by run

	mu    sync.Mutex
	cond  sync.Cond
	ctrl  []*outFrame
	data  []*outFrame
	ready []readyChan
	gated bool
	gen   uint64
	// broken is the last write error; frames fail with it until reset. Used
	// by the agent, whose transport comes back when the host reconnects.
	broken error
	// rebuf asks run to drop the buffered bytes of an older generation.
	rebuf  bool
	closed error
	// onError, if set, is called (once per failure, without mu) when a write
	// fails; the client uses it to tear the connection down.
	onError func(error)
	// onGated, if set, is called with mu held when the gate closes.
	onGated func()
}

func newFrameWriter(w io.Writer) *frameWriter {
	fw := &frameWriter{target: w, bw: bufio.NewWriterSize(w, HeaderSize+MaxPayload)}
	fw.cond.L = &fw.mu
	return fw
}

// enqueue queues of; ctrl frames jump ahead of stream frames. It fails if
// the writer is closed or of belongs to an older session generation.
func (w *frameWriter) enqueue(of *outFrame, ctrl bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed != nil {
		return w.closed
	}
	if of.gen != w.gen {
		return ErrSessionReset
	}
	if ctrl {
		w.ctrl = append(w.ctrl, of)
	} else {
		w.data = append(w.data, of)
	}
	w.cond.Signal()
	return nil
}

// markReady puts channel ch of s at the back of the ready list. It reports
// false if the writer will never write for s (closed, or s belongs to an
// older session); s is then being aborted. Called with s.mu held.
func (w *frameWriter) markReady(s *Stream, ch int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed != nil || s.gen != w.gen {
		return false
	}
	w.ready = append(w.ready, readyChan{s, ch})
	w.cond.Signal()
	return true
}

// generation returns the current session generation.
func (w *frameWriter) generation() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gen
}

// reset starts generation gen: queued frames are dropped, the gate opens and
// a broken transport is assumed to be back.
func (w *frameWriter) reset(gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen = gen
	for _, of := range w.ctrl {
		of.fail(ErrSessionReset)
	}
	for _, of := range w.data {
		of.fail(ErrSessionReset)
	}
	w.ctrl, w.data, w.ready = nil, nil, nil
	w.gated = false
	w.broken = nil
	w.rebuf = true
	w.cond.Broadcast()
}

// ungate reopens the gate (RESUME on the agent).
func (w *frameWriter) ungate() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gated = false
	w.cond.Broadcast()
}

func (w *frameWriter) isGated() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gated
}

// close fails every queued and future frame with err and stops run. The
// streams are not told: their owner aborts them.
func (w *frameWriter) close(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed != nil {
		return
	}
	w.closed = err
	for _, of := range w.ctrl {
		of.fail(err)
	}
	for _, of := range w.data {
		of.fail(err)
	}
	w.ctrl, w.data, w.ready = nil, nil, nil
	w.cond.Broadcast()
}

// next pops the queued frame to write, or nil. Called with mu held.
func (w *frameWriter) next() *outFrame {
	if w.gated {
		for i, of := range w.ctrl {
			if of.gate == gateOpen {
				w.ctrl = append(w.ctrl[:i], w.ctrl[i+1:]...)
				w.gated = false
				return of
			}
		}
		return nil
	}
	var of *outFrame
	switch {
	case len(w.ctrl) > 0:
		of = w.ctrl[0]
		w.ctrl[0] = nil
		w.ctrl = w.ctrl[1:]
	case len(w.data) > 0:
		of = w.data[0]
		w.data[0] = nil
		w.data = w.data[1:]
	default:
		return nil
	}
	if of.gate == gateClose {
		w.gated = true
		if w.onGated != nil {
			w.onGated()
		}
	}
	return of
}

// nextReady pops the stream channel to take DATA from. Called with mu held.
func (w *frameWriter) nextReady() (readyChan, bool) {
	if w.gated || w.broken != nil {
		return readyChan{}, false
	}
	for len(w.ready) > 0 {
		rc := w.ready[0]
		w.ready[0] = readyChan{}
		w.ready = w.ready[1:]
		if rc.s.gen == w.gen {
			return rc, true
		}
	}
	return readyChan{}, false
}

// run writes frames until close. It is the only user of bw and buf.
func (w *frameWriter) run() {
	w.buf = make([]byte, MaxPayload)
	w.mu.Lock()
	for {
		if w.closed != nil {
			w.mu.Unlock()
			return
		}
		if w.rebuf {
			w.rebuf = false
			w.bw.Reset(w.target)
		}
		if of := w.next(); of != nil {
			if of.gen != w.gen {
				of.fail(ErrSessionReset)
				continue
			}
			if w.broken != nil {
				of.fail(w.broken)
				continue
			}
			w.mu.Unlock()
			err := WriteFrame(w.bw, of.f)
			if err == nil && of.done != nil {
				// Whoever waits wants to know the frame reached the transport.
				err = w.bw.Flush()
			}
			w.mu.Lock()
			w.failed(err)
			of.fail(err)
			continue
		}
		if rc, ok := w.nextReady(); ok {
			w.mu.Unlock()
			var err error
			if f, ok := rc.s.takeData(rc.ch, w.buf); ok {
				err = WriteFrame(w.bw, f)
			}
			w.mu.Lock()
			w.failed(err)
			continue
		}
		if w.bw.Buffered() > 0 && w.broken == nil {
			w.mu.Unlock()
			err := w.bw.Flush()
			w.mu.Lock()
			w.failed(err)
			continue
		}
		w.cond.Wait()
	}
}

// failed records a write error. Called with mu held.
func (w *frameWriter) failed(err error) {
	if err == nil || w.broken != nil {
		return
	}
	w.broken = err
	if w.onError != nil {
		w.mu.Unlock()
		w.onError(err)
		w.mu.Lock()
	}
}

// fail completes of with err (nil = written).
func (of *outFrame) fail(err error) {
	if of.done != nil {
		of.done <- err
	}
}
