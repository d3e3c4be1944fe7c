package guestproto

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
)

// Transport is the agent's end of the host channel.
//
// Read returns io.EOF (possibly again and again) while no host is connected.
// WaitHost then blocks until a host may have connected, or returns early at
// worst after a short poll interval; it returns an error only when the
// transport is closed for good or ctx ends.
type Transport interface {
	io.Reader
	io.Writer
	WaitHost(ctx context.Context) error
}

// Handler serves a guest agent's sessions and streams.
type Handler interface {
	// Hello runs the restore hooks for a new session. The agent calls it from
	// its read loop, after dropping the previous session's streams and before
	// it sends HELLO_ACK, so no stream of the session can start before Hello
	// returns. req has been validated.
	Hello(ctx context.Context, req *HelloRequest) HelloReply
	// ServeStream serves one stream in its own goroutine. It sends exactly
	// one Reply first; an exec or write_file ends with Exit. When it returns
	// the agent sends CLOSE (if it has not) and forgets the stream. ctx ends
	// when the agent stops; s.Done() when the stream is aborted.
	ServeStream(ctx context.Context, s *Stream, req *OpenRequest)
}

// Agent is the guest end of the protocol: it reads frames, keeps the session,
// answers BARRIER and PING, and hands each OPENed stream to the Handler.
type Agent struct {
	t   Transport
	h   Handler
	log *slog.Logger
	w   *frameWriter
	m   *mux

	// Owned by the read loop.
	session string
	reply   HelloReply
	gen     uint64

	wg sync.WaitGroup
}

// NewAgent returns an agent serving h over t. It starts nothing; call Run.
func NewAgent(t Transport, h Handler, log *slog.Logger) *Agent {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := newFrameWriter(t)
	return &Agent{t: t, h: h, log: log, w: w, m: newMux(false, w)}
}

// Run serves until ctx ends or the transport reports it is closed. A read
// blocked in the transport is not interrupted by ctx: close the transport
// too. Stream handlers still running when Run returns see ctx end.
func (a *Agent) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		a.w.close(ErrClosed)
		a.m.abortAll(ErrClosed)
		a.wg.Wait()
	}()
	go a.w.run()

	br := bufio.NewReaderSize(a.t, HeaderSize+MaxPayload)
	inSession := false
	for ctx.Err() == nil {
		var f Frame
		var err error
		if inSession {
			f, err = readFrameBuffered(br)
		} else {
			// Outside a session only a HELLO is accepted, found byte by byte:
			// a reconnection may have left us inside a frame.
			f, err = scanFrame(br, FrameHello, MaxHelloPayload, looksLikeHello)
		}
		switch {
		case err == nil:
			inSession = a.handle(ctx, f, inSession)
		case errors.Is(err, ErrInvalidFrame):
			// The header was not consumed: scanning skips it byte by byte.
			a.log.Error("guest protocol desynchronized, waiting for HELLO", "err", err)
			a.endSession()
			inSession = false
		default:
			if ctx.Err() != nil {
				return nil
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				a.log.Error("read host channel", "err", err)
			}
			if inSession {
				a.endSession()
				inSession = false
			}
			br.Reset(a.t)
			if err := a.t.WaitHost(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
	return nil
}

// looksLikeHello accepts a HELLO payload for resynchronization.
func looksLikeHello(payload []byte) bool {
	var req HelloRequest
	return json.Unmarshal(payload, &req) == nil && req.Session != ""
}

// endSession drops every stream of the current session; their handlers see
// ErrSessionReset and queued frames are discarded.
func (a *Agent) endSession() {
	a.gen++
	a.session = ""
	a.w.reset(a.gen)
	a.m.abortAll(ErrSessionReset)
}

// handle processes one frame and reports whether a session is open after it.
func (a *Agent) handle(ctx context.Context, f Frame, inSession bool) bool {
	switch f.Type {
	case FrameHello:
		return a.hello(ctx, f, inSession)
	case FrameBarrier:
		a.ctrl(Frame{Type: FrameBarrierAck}, gateClose)
	case FrameResume:
		a.w.ungate()
	case FramePing:
		a.ctrl(Frame{Type: FramePong, Payload: f.Payload}, gateNone)
	case FrameOpen:
		a.open(ctx, f)
	case FrameData, FrameWindow, FrameClose, FrameReset:
		a.m.streamFrame(f)
	default:
		// Host-bound frame types are ignored.
	}
	return inSession
}

func (a *Agent) ctrl(f Frame, gate gateOp) {
	_ = a.w.enqueue(&outFrame{f: f, gen: a.gen, gate: gate}, true)
}

func (a *Agent) hello(ctx context.Context, f Frame, inSession bool) bool {
	var req HelloRequest
	err := json.Unmarshal(f.Payload, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		a.log.Error("reject HELLO", "err", err)
		b, _ := json.Marshal(HelloReply{Session: req.Session, Error: Errorf(CodeInvalid, "%v", err)})
		a.ctrl(Frame{Type: FrameHelloAck, Payload: b}, gateNone)
		return inSession
	}
	if inSession && req.Session == a.session {
		// A retransmitted HELLO: answer again, change nothing.
		a.ackHello()
		return true
	}
	a.endSession()
	a.reply = a.h.Hello(ctx, &req)
	a.reply.Session = req.Session
	a.session = req.Session
	a.ackHello()
	return true
}

func (a *Agent) ackHello() {
	b, err := json.Marshal(a.reply)
	if err != nil {
		a.log.Error("encode HELLO_ACK", "err", err)
		return
	}
	a.ctrl(Frame{Type: FrameHelloAck, Payload: b}, gateNone)
}

func (a *Agent) open(ctx context.Context, f Frame) {
	s, _ := a.m.add(f.Stream, a.gen, 0, false)
	if s == nil {
		e := &Error{Code: CodeInvalid, Message: "stream id already in use"}
		b, _ := json.Marshal(e)
		_ = a.w.enqueue(&outFrame{f: Frame{Type: FrameReset, Stream: f.Stream, Payload: b}, gen: a.gen}, true)
		return
	}
	var req OpenRequest
	err := json.Unmarshal(f.Payload, &req)
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.finish(s)
		if err != nil {
			_ = s.Reply(Reply{Error: Errorf(CodeInvalid, "decode OPEN: %v", err)})
			return
		}
		a.h.ServeStream(ctx, s, &req)
	}()
}

// finish ends a stream whose handler returned.
func (a *Agent) finish(s *Stream) {
	_ = s.CloseWrite()
	s.abort(errStreamFinished, nil)
}
