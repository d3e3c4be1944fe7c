package guestproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// grantThreshold is how many consumed bytes a receiver lets accumulate before
// it returns them to the sender as credit in one WINDOW frame.
const grantThreshold = InitialWindow / 4

// maxCredit bounds the credit a peer may grant, to catch runaway WINDOWs.
const maxCredit = 1 << 30

// errStreamFinished marks a guest stream whose handler returned.
var errStreamFinished = errors.New("stream handler finished")

// Stream is one multiplexed stream. Each stream has one data channel in each
// direction plus, from guest to host, a second channel for exec stderr; each
// channel has its own flow-control credit, so memory per stream is bounded
// and a reader that stops reading stops the writer.
//
// Read, Write and WriteStderr may be called concurrently with each other; each
// serializes with itself.
type Stream struct {
	id  uint32
	m   *mux
	gen uint64
	// dial marks a host's dial stream (OpDial), set before the stream is
	// used: each side's CLOSE ends only its own direction, so the host
	// may write after the guest's CLOSE, and the stream ends when both
	// have sent CLOSE (or at a RESET). It counts against
	// ClientConfig.MaxDials, not MaxStreams.
	dial bool

	rxMu [2]sync.Mutex // serializes readers of each channel
	txMu [2]sync.Mutex // serializes writers of each channel

	mu           sync.Mutex
	rx           [2]rxState
	tx           [2]txState
	localClosed  bool // we sent CLOSE
	remoteClosed bool // the peer sent CLOSE
	err          error
	done         chan struct{} // closed when err is set

	// Host side only: the REPLY and EXIT payloads, and rclosed, closed on
	// the guest's CLOSE.
	reply   chan []byte
	exit    chan []byte
	rclosed chan struct{}
	// stop detaches the host's context.AfterFunc; guarded by mu.
	stop func() bool
	// deadline, if set, aborts the stream when it fires (host side: a
	// guest that does not answer in time); guarded by mu.
	deadline *time.Timer
	// replied is set when the guest's REPLY arrives (host side).
	replied atomic.Bool
	// probe, if set, starts the client's liveness probe should the REPLY
	// be late (Client.probe); guarded by mu, stopped by detach.
	probe *time.Timer
}

type rxState struct {
	chunks  [][]byte
	packed  bool // the last chunk is ours to append small payloads to
	n       int  // buffered bytes
	avail   int  // credit the peer has left
	unacked int  // consumed bytes not yet granted back
	discard bool // nobody reads: drop data and grant credit at once
	wake    chan struct{}
}

type txState struct {
	credit int
	// pending is the rest of the buffer a blocked Write is sending; the
	// writer takes it frame by frame, charging credit as it goes.
	pending []byte
	// queued: the channel is on the writer's ready list.
	queued bool
	// wake tells the blocked Write that pending shrank or credit came.
	wake chan struct{}
}

func newStream(m *mux, id uint32, gen uint64) *Stream {
	s := &Stream{id: id, m: m, gen: gen, done: make(chan struct{})}
	for i := range s.rx {
		s.rx[i] = rxState{avail: InitialWindow, wake: make(chan struct{}, 1)}
		s.tx[i] = txState{credit: InitialWindow, wake: make(chan struct{}, 1)}
	}
	if m.host {
		s.reply = make(chan []byte, 1)
		s.exit = make(chan []byte, 1)
		s.rclosed = make(chan struct{})
	}
	return s
}

// ID returns the stream id.
func (s *Stream) ID() uint32 { return s.id }

// Done is closed when the stream is aborted: reset by either side, its
// session replaced, its connection closed, or (guest) its handler returned.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Err returns why Done was closed, or nil.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Read reads the peer's data (exec stdin, upload bytes, download bytes or
// exec stdout). It returns io.EOF after the peer's CLOSE.
func (s *Stream) Read(p []byte) (int, error) { return s.read(0, p, nil) }

// Write sends p as DATA, waiting for credit.
func (s *Stream) Write(p []byte) (int, error) { return s.write(0, p, nil) }

// WriteStderr sends p as DATA flagged STDERR (guest side, exec only).
func (s *Stream) WriteStderr(p []byte) (int, error) { return s.write(1, p, nil) }

// Reply sends the REPLY frame, the guest's first frame on a stream.
func (s *Stream) Reply(r Reply) error { return s.sendJSON(FrameReply, r) }

// Exit sends the EXIT frame, the final result of a stream (guest side).
func (s *Stream) Exit(r Reply) error { return s.sendJSON(FrameExit, r) }

// CloseWrite sends CLOSE: no more DATA from this side. It is idempotent.
// It waits for a Write in progress on the stream to return. On the host,
// the CLOSE that ends a dial stream's second direction ends the stream.
func (s *Stream) CloseWrite() error {
	for i := range s.txMu {
		s.txMu[i].Lock()
		defer s.txMu[i].Unlock()
	}
	s.mu.Lock()
	if s.localClosed || s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	s.localClosed = true
	over := s.m.host && s.dial && s.remoteClosed
	s.mu.Unlock()
	err := s.m.w.enqueue(&outFrame{f: Frame{Type: FrameClose, Stream: s.id}, gen: s.gen}, false)
	if over {
		s.detach()
	}
	return err
}

// Reset aborts the stream and tells the peer why with a RESET frame.
func (s *Stream) Reset(e *Error) {
	s.abort(e, e)
}

// DiscardInput declares that nobody will read the peer's data any more:
// what is buffered and what arrives later is dropped and its credit returned.
func (s *Stream) DiscardInput() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.rx {
		rx := &s.rx[i]
		rx.discard = true
		rx.unacked += rx.n
		rx.chunks, rx.n = nil, 0
		s.grantLocked(i, true)
	}
}

func (s *Stream) sendJSON(t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", t, err)
	}
	if len(b) > MaxPayload {
		return fmt.Errorf("encode %s: %d bytes exceed the frame limit", t, len(b))
	}
	s.mu.Lock()
	err = s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.m.w.enqueue(&outFrame{f: Frame{Type: t, Stream: s.id, Payload: b}, gen: s.gen}, false)
}

// write sends p as DATA on channel ch. It parks p on the stream and waits
// until the frame writer has taken all of it (see frameWriter): credit is
// charged as the writer takes bytes, so a transport that does not drain
// holds the caller here rather than a copy of p in a queue. A closed
// cancel (a deadline; nil: none) ends the wait with
// os.ErrDeadlineExceeded and the count of the bytes the writer took.
func (s *Stream) write(ch int, p []byte, cancel <-chan struct{}) (int, error) {
	s.txMu[ch].Lock()
	defer s.txMu[ch].Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.writableLocked(); err != nil {
		return 0, err
	}
	if closed(cancel) {
		return 0, os.ErrDeadlineExceeded
	}
	tx := &s.tx[ch]
	tx.pending = p
	s.readyLocked(ch)
	for len(tx.pending) > 0 {
		err := s.writableLocked()
		if err == nil && closed(cancel) {
			err = os.ErrDeadlineExceeded
		}
		if err != nil {
			// The writer takes bytes only under s.mu: what it has not
			// taken yet is not sent.
			n := len(p) - len(tx.pending)
			tx.pending = nil
			return n, err
		}
		s.mu.Unlock()
		select {
		case <-tx.wake:
		case <-s.done:
		case <-cancel:
		}
		s.mu.Lock()
	}
	tx.pending = nil
	return len(p), nil
}

// closed reports whether c is closed (false for nil).
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// writableLocked reports why DATA can no longer be sent, or nil.
func (s *Stream) writableLocked() error {
	switch {
	case s.err != nil:
		return s.err
	case s.localClosed:
		return io.ErrClosedPipe
	case s.m.host && s.remoteClosed && !s.dial:
		return ErrStreamDone
	}
	return nil
}

// readyLocked puts channel ch on the writer's ready list if it has DATA
// to send and credit for it, and is not listed yet.
func (s *Stream) readyLocked(ch int) {
	tx := &s.tx[ch]
	if tx.queued || tx.credit == 0 || len(tx.pending) == 0 || s.writableLocked() != nil {
		return
	}
	tx.queued = s.m.w.markReady(s, ch)
}

// takeData is called by the frame writer for a channel on its ready list:
// it moves up to one frame of pending DATA into buf, charging the credit,
// and returns the frame to write. It reports false if there is nothing to
// send any more.
func (s *Stream) takeData(ch int, buf []byte) (Frame, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &s.tx[ch]
	tx.queued = false
	if s.writableLocked() != nil || len(tx.pending) == 0 || tx.credit == 0 {
		notify(tx.wake)
		return Frame{}, false
	}
	k := min(len(tx.pending), tx.credit, len(buf))
	copy(buf, tx.pending[:k])
	tx.pending = tx.pending[k:]
	tx.credit -= k
	if len(tx.pending) == 0 {
		notify(tx.wake)
	} else {
		s.readyLocked(ch) // to the back of the list: streams take turns
	}
	var flags uint8
	if ch == 1 {
		flags = FlagStderr
	}
	return Frame{Type: FrameData, Flags: flags, Stream: s.id, Payload: buf[:k]}, true
}

// read reads the peer's data of channel ch. A closed cancel (a deadline;
// nil: none) ends it with os.ErrDeadlineExceeded, buffered data or not.
func (s *Stream) read(ch int, p []byte, cancel <-chan struct{}) (int, error) {
	s.rxMu[ch].Lock()
	defer s.rxMu[ch].Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	rx := &s.rx[ch]
	for {
		if s.err != nil {
			return 0, s.err
		}
		if closed(cancel) {
			return 0, os.ErrDeadlineExceeded
		}
		if rx.n > 0 {
			if len(p) == 0 {
				return 0, nil
			}
			n := 0
			for n < len(p) && len(rx.chunks) > 0 {
				c := copy(p[n:], rx.chunks[0])
				n += c
				if c == len(rx.chunks[0]) {
					rx.chunks[0] = nil
					rx.chunks = rx.chunks[1:]
				} else {
					rx.chunks[0] = rx.chunks[0][c:]
				}
			}
			rx.n -= n
			rx.unacked += n
			s.grantLocked(ch, false)
			return n, nil
		}
		if s.remoteClosed {
			return 0, io.EOF
		}
		s.mu.Unlock()
		select {
		case <-rx.wake:
		case <-s.done:
		case <-cancel:
		}
		s.mu.Lock()
	}
}

// grantLocked sends accumulated credit back to the peer once it is worth a
// frame (or now, if force). Called with s.mu held.
func (s *Stream) grantLocked(ch int, force bool) {
	rx := &s.rx[ch]
	if rx.unacked == 0 || (!force && rx.unacked < grantThreshold) || s.err != nil || s.remoteClosed {
		return
	}
	n := rx.unacked
	rx.unacked = 0
	rx.avail += n
	var flags uint8
	if ch == 1 {
		flags = FlagStderr
	}
	payload := binary.BigEndian.AppendUint32(nil, uint32(n))
	// A failed enqueue means the session or connection is gone; the stream
	// learns that through abort.
	_ = s.m.w.enqueue(&outFrame{f: Frame{Type: FrameWindow, Flags: flags, Stream: s.id, Payload: payload}, gen: s.gen}, true)
}

// onData buffers an incoming DATA payload. It returns an error if the peer
// exceeded its credit.
func (s *Stream) onData(flags uint8, payload []byte) error {
	ch := 0
	if flags&FlagStderr != 0 {
		ch = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.remoteClosed {
		return nil
	}
	rx := &s.rx[ch]
	if len(payload) > rx.avail {
		return fmt.Errorf("stream %d: %d bytes of DATA exceed the %d bytes of credit", s.id, len(payload), rx.avail)
	}
	rx.avail -= len(payload)
	if len(payload) == 0 {
		return nil
	}
	if rx.discard {
		rx.unacked += len(payload)
		s.grantLocked(ch, true)
		return nil
	}
	rx.append(payload)
	rx.n += len(payload)
	notify(rx.wake)
	return nil
}

// packChunk is the size under which DATA payloads are copied into shared
// chunks of that size instead of being kept as they came: a peer that sends
// its credit in one-byte frames must not cost an allocation per byte. So
// buffered DATA never takes more than twice its size in memory.
const packChunk = 4 << 10

// append buffers payload, which the caller hands over.
func (rx *rxState) append(payload []byte) {
	if k := len(rx.chunks); k > 0 && rx.packed {
		last := rx.chunks[k-1]
		if cap(last)-len(last) >= len(payload) {
			rx.chunks[k-1] = append(last, payload...)
			return
		}
	}
	if len(payload) < packChunk {
		c := make([]byte, 0, packChunk)
		rx.chunks = append(rx.chunks, append(c, payload...))
		rx.packed = true
		return
	}
	rx.chunks = append(rx.chunks, payload)
	rx.packed = false
}

// onWindow adds credit granted by the peer.
func (s *Stream) onWindow(flags uint8, payload []byte) error {
	ch := 0
	if flags&FlagStderr != 0 {
		ch = 1
	}
	n := int(binary.BigEndian.Uint32(payload))
	s.mu.Lock()
	defer s.mu.Unlock()
	tx := &s.tx[ch]
	if tx.credit+n > maxCredit {
		return fmt.Errorf("stream %d: WINDOW grants %d bytes over %d of credit", s.id, n, tx.credit)
	}
	tx.credit += n
	s.readyLocked(ch)
	notify(tx.wake)
	return nil
}

// onClose records the peer's CLOSE. It reports whether the stream is over
// for the host (the guest's CLOSE is its last frame, but for a dial
// stream whose host has not sent its own CLOSE yet).
func (s *Stream) onClose() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.remoteClosed {
		return false
	}
	s.remoteClosed = true
	over := !s.dial || s.localClosed
	if s.rclosed != nil {
		close(s.rclosed)
	}
	for i := range s.rx {
		notify(s.rx[i].wake)
		notify(s.tx[i].wake)
	}
	return over
}

// abort ends the stream with err, unless it already ended. If send is not
// nil, a RESET carrying it goes to the peer. The stream leaves the table.
func (s *Stream) abort(err error, send *Error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	close(s.done)
	for i := range s.rx {
		s.rx[i].chunks, s.rx[i].n = nil, 0
	}
	s.mu.Unlock()
	if send != nil {
		b, _ := json.Marshal(send)
		_ = s.m.w.enqueue(&outFrame{f: Frame{Type: FrameReset, Stream: s.id, Payload: b}, gen: s.gen}, true)
	}
	s.detach()
}

// setStop records the function that detaches the host's context watcher.
func (s *Stream) setStop(stop func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop = stop
}

// setDeadline arms, or re-arms, the stream's deadline (host side): if it
// is still open d from now, it is aborted with err and the guest gets a
// RESET. d <= 0 disarms it.
func (s *Stream) setDeadline(d time.Duration, err *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.deadline != nil {
		s.deadline.Stop()
		s.deadline = nil
	}
	if d <= 0 || s.err != nil {
		return
	}
	s.deadline = time.AfterFunc(d, func() { s.abort(err, err) })
}

// detach ends the host's interest in the stream: it stops watching the
// host's context and the deadline, and takes the stream out of the table,
// so that it no longer counts against the stream limit and whatever the
// guest still sends on it is dropped. Every host operation calls it when it
// is done with its stream (and abort and the guest's CLOSE do).
func (s *Stream) detach() {
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	if s.deadline != nil {
		s.deadline.Stop()
		s.deadline = nil
	}
	if s.probe != nil {
		s.probe.Stop()
		s.probe = nil
	}
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	s.m.remove(s)
}

// notify wakes the waiter on c, if any, without blocking.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
