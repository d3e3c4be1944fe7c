// Package hostile is a guest agent gone bad, for tests of the host: Guest
// wraps the transport and the handler of a real guest agent and serves
// normally (so a template bakes: HELLO, the warm-up execs, BARRIER), until
// an exec of argv ["hostile", MODE, ARG...] turns it hostile in the way MODE
// names. It never runs in a real sandbox: only tests build it into a guest
// image (cmd hostileguest).
//
// Modes that act on the exec's own stream:
//
//	flood        REPLY, then up to 64 MiB of stdout without waiting for credit
//	garbage      REPLY, then a malformed frame header
//	bad-reply    a REPLY that is 64 KiB of unterminated JSON
//	hang         REPLY, "hanging\n" on stdout, then nothing: the exec never
//	             ends (timeout_ms ignored)
//	stop-reading REPLY, then the agent never reads its channel again
//	no-barrier   BARRIER is dropped from now on; this exec's stdout says
//	             "no-barrier armed\n", then "barrier dropped\n" for each
//	             dropped one; the exec runs until it is killed
//
// Modes that set a trap for a later request and end the exec with status 0:
//
//	grant-and-stop  the next write_file: REPLY, a WINDOW of a GiB of credit,
//	                then the agent never reads its channel again
//	huge-list [N]   the next list_dir: 1,000,000 generated entries, each a
//	                symlink whose target is N bytes long (default 0)
//	endless-list    the next list_dir: one JSON value that never ends
//	silent          no request gets an answer any more
package hostile

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// Guest is both the Transport and the Handler of a guestproto.Agent:
//
//	g := hostile.New(port, server)
//	guestproto.NewAgent(g, g, log).Run(ctx)
//
// As a Transport it reads the host's frames one at a time (so it can drop
// BARRIER, or stop reading), and it writes whatever the agent writes while
// tracking frame boundaries, so that frames it makes up itself go out whole
// between the agent's.
type Guest struct {
	port  guestproto.Transport
	inner guestproto.Handler

	br  *bufio.Reader // over port; used by Read only
	out []byte        // host bytes passed on, not yet returned by Read

	stopRead    chan struct{} // closed: Read blocks until Close
	stopOnce    sync.Once
	closed      chan struct{}
	closeOnce   sync.Once
	dropBarrier atomic.Bool
	dropped     chan struct{} // a token per dropped BARRIER

	mu     sync.Mutex
	traps  map[guestproto.Op][]string // armed traps: mode and args, by operation
	silent bool

	wmu  sync.Mutex
	wc   sync.Cond // signalled after every write
	hdr  [guestproto.HeaderSize]byte
	hdrN int // header bytes of the frame being written, seen so far
	rem  int // payload bytes of the frame being written, still to come
}

var (
	_ guestproto.Transport = (*Guest)(nil)
	_ guestproto.Handler   = (*Guest)(nil)
)

// New wraps the transport port and the handler inner of a guest agent.
func New(port guestproto.Transport, inner guestproto.Handler) *Guest {
	g := &Guest{
		port:     port,
		inner:    inner,
		br:       bufio.NewReaderSize(port, guestproto.HeaderSize+guestproto.MaxPayload),
		stopRead: make(chan struct{}),
		closed:   make(chan struct{}),
		dropped:  make(chan struct{}, 16),
		traps:    make(map[guestproto.Op][]string),
	}
	g.wc.L = &g.wmu
	return g
}

// Close makes a Read that stopped reading return net.ErrClosed. It does not
// close the wrapped transport.
func (g *Guest) Close() error {
	g.closeOnce.Do(func() { close(g.closed) })
	return nil
}

// Read passes on the host's frames one by one, but for dropped BARRIERs. An
// invalid header is passed on a byte at a time, for the agent to skip.
func (g *Guest) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if err := g.fill(); err != nil {
			return 0, err
		}
	}
	// Checked after the read that may have been waiting for the host: from
	// stopReading on, nothing more reaches the agent.
	select {
	case <-g.stopRead:
		<-g.closed
		return 0, net.ErrClosed
	default:
	}
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

// fill moves the next frame (or invalid byte) from the port to g.out. A
// frame cut short by a hang-up is dropped and the hang-up reported.
func (g *Guest) fill() error {
	hb, err := g.br.Peek(guestproto.HeaderSize)
	if err != nil {
		_, _ = g.br.Discard(len(hb))
		return err
	}
	if _, err := guestproto.ReadFrame(bytes.NewReader(hb)); errors.Is(err, guestproto.ErrInvalidFrame) {
		b, _ := g.br.ReadByte()
		g.out = append(g.out[:0], b)
		return nil
	}
	total := guestproto.HeaderSize + int(binary.BigEndian.Uint32(hb[8:12]))
	fb, err := g.br.Peek(total)
	if err != nil {
		_, _ = g.br.Discard(len(fb))
		if errors.Is(err, io.EOF) {
			return io.EOF
		}
		return err
	}
	if guestproto.FrameType(fb[0]) == guestproto.FrameBarrier && g.dropBarrier.Load() {
		_, _ = g.br.Discard(total)
		select {
		case g.dropped <- struct{}{}:
		default:
		}
		return nil
	}
	g.out = append(g.out[:0], fb...)
	_, _ = g.br.Discard(total)
	return nil
}

// WaitHost is the port's.
func (g *Guest) WaitHost(ctx context.Context) error { return g.port.WaitHost(ctx) }

// Write writes the agent's bytes and keeps track of where its frames end.
func (g *Guest) Write(p []byte) (int, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	defer g.wc.Broadcast()
	n, err := g.port.Write(p)
	g.track(p[:n])
	if err != nil {
		// A frame cut short; the next host resynchronizes on its HELLO.
		g.hdrN, g.rem = 0, 0
	}
	return n, err
}

func (g *Guest) track(b []byte) {
	for len(b) > 0 {
		if g.rem > 0 {
			k := min(g.rem, len(b))
			g.rem -= k
			b = b[k:]
			continue
		}
		k := copy(g.hdr[g.hdrN:], b)
		g.hdrN += k
		b = b[k:]
		if g.hdrN == guestproto.HeaderSize {
			g.rem = int(binary.BigEndian.Uint32(g.hdr[8:12]))
			g.hdrN = 0
		}
	}
}

// inject writes b (whole frames) between two of the agent's frames.
func (g *Guest) inject(b []byte) error {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	for g.hdrN != 0 || g.rem != 0 {
		g.wc.Wait()
	}
	_, err := g.port.Write(b)
	return err
}

func (g *Guest) injectJSON(t guestproto.FrameType, stream uint32, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return g.inject(guestproto.AppendFrame(nil, guestproto.Frame{Type: t, Stream: stream, Payload: b}))
}

func (g *Guest) stopReading() { g.stopOnce.Do(func() { close(g.stopRead) }) }

// Hello is the wrapped handler's.
func (g *Guest) Hello(ctx context.Context, req *guestproto.HelloRequest) guestproto.HelloReply {
	return g.inner.Hello(ctx, req)
}

// ServeStream serves hostile execs and armed traps, and passes anything
// else to the wrapped handler.
func (g *Guest) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	g.mu.Lock()
	silent := g.silent
	var trap []string
	if t := g.traps[req.Op]; len(t) > 0 {
		trap = t
		delete(g.traps, req.Op)
	}
	g.mu.Unlock()
	switch {
	case silent:
		<-s.Done()
	case req.Op == guestproto.OpExec && req.Exec != nil && len(req.Exec.Argv) >= 2 && req.Exec.Argv[0] == "hostile":
		g.exec(s, req.Exec.Argv[1], req.Exec.Argv[2:])
	case trap != nil:
		g.spring(s, req, trap[0], trap[1:])
	default:
		g.inner.ServeStream(ctx, s, req)
	}
}

// exec runs a hostile exec.
func (g *Guest) exec(s *guestproto.Stream, mode string, args []string) {
	const pid = 4242
	ok := func() {
		_ = s.Reply(guestproto.Reply{PID: pid})
		_ = s.Exit(guestproto.Reply{Exec: &guestproto.ExecResult{}})
	}
	switch mode {
	case "flood":
		if g.injectJSON(guestproto.FrameReply, s.ID(), guestproto.Reply{PID: pid}) != nil {
			return
		}
		frame := guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameData, Stream: s.ID(), Payload: bytes.Repeat([]byte("F"), guestproto.MaxPayload)})
		// 64 MiB: 256 times the credit, and short enough that the guest,
		// which may only see the host's RESET late, answers again soon.
		for range (64 << 20) / guestproto.MaxPayload {
			select {
			case <-s.Done():
				return
			default:
			}
			if g.inject(frame) != nil {
				return
			}
		}
	case "garbage":
		if g.injectJSON(guestproto.FrameReply, s.ID(), guestproto.Reply{PID: pid}) == nil {
			_ = g.inject(bytes.Repeat([]byte{0xff}, 4*guestproto.HeaderSize))
		}
	case "bad-reply":
		payload := append([]byte(`{"pid":4242,"info":{"name":"`), bytes.Repeat([]byte("j"), guestproto.MaxPayload-40)...)
		_ = g.inject(guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameReply, Stream: s.ID(), Payload: payload}))
	case "hang":
		_ = s.Reply(guestproto.Reply{PID: pid})
		s.DiscardInput()
		_, _ = s.Write([]byte("hanging\n"))
		<-s.Done()
	case "stop-reading":
		g.stopReading() // before REPLY: the host's next frame is never read
		_ = s.Reply(guestproto.Reply{PID: pid})
		<-s.Done()
	case "no-barrier":
		g.dropBarrier.Store(true)
		if s.Reply(guestproto.Reply{PID: pid}) != nil {
			return
		}
		s.DiscardInput()
		if _, err := s.Write([]byte("no-barrier armed\n")); err != nil {
			return
		}
		for {
			select {
			case <-g.dropped:
				if _, err := s.Write([]byte("barrier dropped\n")); err != nil {
					return
				}
			case <-s.Done():
				return
			}
		}
	case "grant-and-stop", "huge-list", "endless-list":
		op := guestproto.OpWriteFile
		if strings.HasSuffix(mode, "-list") {
			op = guestproto.OpListDir
		}
		g.mu.Lock()
		g.traps[op] = append([]string{mode}, args...)
		g.mu.Unlock()
		ok()
	case "silent":
		ok()
		g.mu.Lock()
		g.silent = true
		g.mu.Unlock()
	default:
		_ = s.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInvalid, "unknown hostile mode %q", mode)})
	}
}

// spring serves a request that walked into a trap.
func (g *Guest) spring(s *guestproto.Stream, req *guestproto.OpenRequest, mode string, args []string) {
	switch mode {
	case "grant-and-stop":
		g.stopReading()
		grant := binary.BigEndian.AppendUint32(nil, 1<<30-guestproto.InitialWindow)
		if g.injectJSON(guestproto.FrameReply, s.ID(), guestproto.Reply{}) != nil ||
			g.inject(guestproto.AppendFrame(nil, guestproto.Frame{Type: guestproto.FrameWindow, Stream: s.ID(), Payload: grant})) != nil {
			return
		}
		<-s.Done()
	case "huge-list":
		target := 0
		if len(args) > 0 {
			target, _ = strconv.Atoi(args[0])
		}
		if s.Reply(guestproto.Reply{}) != nil {
			return
		}
		bw := bufio.NewWriterSize(s, guestproto.MaxPayload)
		enc := json.NewEncoder(bw)
		for i := range 1_000_000 {
			name := fmt.Sprintf("link-%07d", i)
			fi := guestproto.FileInfo{Name: name, Path: path.Join(req.Path, name), Mode: 0o777, IsSymlink: true, LinkTarget: strings.Repeat("t", target)}
			if enc.Encode(fi) != nil {
				return
			}
		}
		_ = bw.Flush()
	case "endless-list":
		if s.Reply(guestproto.Reply{}) != nil {
			return
		}
		if _, err := s.Write([]byte(`{"name":"`)); err != nil {
			return
		}
		chunk := bytes.Repeat([]byte("e"), guestproto.MaxPayload)
		for {
			if _, err := s.Write(chunk); err != nil {
				return
			}
		}
	}
}
