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

// outFrame is a frame waiting in the writer's queue.
type outFrame struct {
	f    Frame
	gen  uint64
	gate gateOp
	// pooled means f.Payload came from payloadPool and returns there once written.
	pooled bool
	// done, if not nil, receives the outcome of the write.
	done chan error
}

var payloadPool = sync.Pool{New: func() any { b := make([]byte, MaxPayload); return &b }}

// frameWriter owns the write side of the transport: one goroutine (run)
// writes queued frames, so a frame is never interleaved with another and no
// reader ever blocks on the transport. Control frames (WINDOW, RESET, session
// frames) jump the queue; stream frames (OPEN, REPLY, DATA, EXIT, CLOSE) keep
// their order.
//
// The gate implements BARRIER: once a gateClose frame is picked, nothing but a
// gateOpen frame is written until ungate or reset.
//
// Every queued frame carries the session generation it belongs to; reset
// bumps the generation and drops the frames of older ones.
type frameWriter struct {
	target io.Writer
	bw     *bufio.Writer

	mu    sync.Mutex
	cond  sync.Cond
	ctrl  []*outFrame
	data  []*outFrame
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
		of.release()
		return w.closed
	}
	if of.gen != w.gen {
		of.release()
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
	w.ctrl, w.data = nil, nil
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

// close fails every queued and future frame with err and stops run.
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
	w.ctrl, w.data = nil, nil
	w.cond.Broadcast()
}

// next pops the frame to write, or nil. Called with mu held.
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

// run writes frames until close. It is the only user of bw.
func (w *frameWriter) run() {
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
		of := w.next()
		if of == nil {
			if w.bw.Buffered() > 0 && w.broken == nil {
				w.mu.Unlock()
				err := w.bw.Flush()
				w.mu.Lock()
				w.failed(err)
				continue
			}
			w.cond.Wait()
			continue
		}
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
		of.fail(err)
		w.mu.Lock()
		w.failed(err)
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

// fail completes of with err (nil = written) and releases its payload.
func (of *outFrame) fail(err error) {
	if of.done != nil {
		of.done <- err
	}
	of.release()
}

func (of *outFrame) release() {
	if of.pooled {
		b := of.f.Payload[:MaxPayload]
		of.f.Payload = nil
		of.pooled = false
		payloadPool.Put(&b)
	}
}
