// Package guestproto owns the wire protocol between the host and the guest agent:
// a framed, flow-controlled stream multiplexer over one byte stream (a
// virtio-serial port in the guest, a unix socket on the host), its JSON
// messages, the guest-side protocol engine (Agent) and the host-side Client.
//
// The protocol is specified in api/guest-protocol.md. This package depends on
// the standard library only, so both the host and the static guest agent can
// import it.
package guestproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire constants.
const (
	// HeaderSize is the size of a frame header in bytes.
	HeaderSize = 12
	// MaxPayload is the largest payload a frame may carry.
	MaxPayload = 64 << 10
	// MaxHelloPayload is the largest HELLO payload; the agent only
	// resynchronizes on HELLO frames up to this size.
	MaxHelloPayload = 16 << 10
	// InitialWindow is the flow-control credit each side starts with, per
	// stream and per direction (and separately for exec stderr).
	InitialWindow = 256 << 10
)

// FrameType is the first byte of a frame header.
type FrameType uint8

// Frame types. The values are part of the wire format and never change.
const (
	FrameHello      FrameType = 1  // host -> guest, stream 0, JSON HelloRequest
	FrameHelloAck   FrameType = 2  // guest -> host, stream 0, JSON HelloReply
	FrameOpen       FrameType = 3  // host -> guest, new stream, JSON OpenRequest
	FrameReply      FrameType = 4  // guest -> host, first frame of a stream, JSON Reply
	FrameData       FrameType = 5  // both, stream bytes; FlagStderr for exec stderr
	FrameExit       FrameType = 6  // guest -> host, final result of a stream, JSON Reply
	FrameClose      FrameType = 7  // both, half-close: the sender sends no more DATA
	FrameReset      FrameType = 8  // both, abort the stream, JSON Error
	FrameWindow     FrameType = 9  // both, credit grant: u32 big-endian byte count
	FrameBarrier    FrameType = 10 // host -> guest, stream 0
	FrameBarrierAck FrameType = 11 // guest -> host, stream 0
	FrameResume     FrameType = 12 // host -> guest, stream 0
	FramePing       FrameType = 13 // host -> guest, stream 0, opaque payload
	FramePong       FrameType = 14 // guest -> host, stream 0, the PING payload echoed
)

// FlagStderr marks a DATA frame as exec stderr and a WINDOW frame as a grant
// of stderr credit.
const FlagStderr uint8 = 0x01

var frameNames = map[FrameType]string{
	FrameHello: "HELLO", FrameHelloAck: "HELLO_ACK", FrameOpen: "OPEN",
	FrameReply: "REPLY", FrameData: "DATA", FrameExit: "EXIT", FrameClose: "CLOSE",
	FrameReset: "RESET", FrameWindow: "WINDOW", FrameBarrier: "BARRIER",
	FrameBarrierAck: "BARRIER_ACK", FrameResume: "RESUME", FramePing: "PING",
	FramePong: "PONG",
}

func (t FrameType) String() string {
	if s, ok := frameNames[t]; ok {
		return s
	}
	return fmt.Sprintf("FrameType(%d)", uint8(t))
}

// sessionFrame reports whether frames of type t belong to stream 0.
func (t FrameType) sessionFrame() bool {
	switch t {
	case FrameHello, FrameHelloAck, FrameBarrier, FrameBarrierAck, FrameResume, FramePing, FramePong:
		return true
	}
	return false
}

// ErrInvalidFrame is wrapped by every error about a malformed frame header.
var ErrInvalidFrame = errors.New("invalid frame")

// Frame is one decoded frame.
type Frame struct {
	Type    FrameType
	Flags   uint8
	Stream  uint32
	Payload []byte
}

func (f Frame) String() string {
	return fmt.Sprintf("%s stream=%d flags=%#x len=%d", f.Type, f.Stream, f.Flags, len(f.Payload))
}

// header is a parsed and validated frame header.
type header struct {
	typ    FrameType
	flags  uint8
	stream uint32
	length uint32
}

// parseHeader decodes and validates a 12-byte header.
func parseHeader(b []byte) (header, error) {
	h := header{
		typ:    FrameType(b[0]),
		flags:  b[1],
		stream: binary.BigEndian.Uint32(b[4:8]),
		length: binary.BigEndian.Uint32(b[8:12]),
	}
	if _, ok := frameNames[h.typ]; !ok {
		return h, fmt.Errorf("%w: unknown type %d", ErrInvalidFrame, b[0])
	}
	if b[2] != 0 || b[3] != 0 {
		return h, fmt.Errorf("%w: reserved bits set in %s", ErrInvalidFrame, h.typ)
	}
	if h.length > MaxPayload {
		return h, fmt.Errorf("%w: %s payload of %d bytes exceeds %d", ErrInvalidFrame, h.typ, h.length, MaxPayload)
	}
	if h.typ.sessionFrame() != (h.stream == 0) {
		return h, fmt.Errorf("%w: %s on stream %d", ErrInvalidFrame, h.typ, h.stream)
	}
	if h.flags&^FlagStderr != 0 || (h.flags != 0 && h.typ != FrameData && h.typ != FrameWindow) {
		return h, fmt.Errorf("%w: flags %#x on %s", ErrInvalidFrame, h.flags, h.typ)
	}
	if h.typ == FrameWindow && h.length != 4 {
		return h, fmt.Errorf("%w: WINDOW payload of %d bytes", ErrInvalidFrame, h.length)
	}
	return h, nil
}

// putHeader encodes the header of f into b[:HeaderSize].
func putHeader(b []byte, f *Frame) {
	b[0] = byte(f.Type)
	b[1] = f.Flags
	b[2], b[3] = 0, 0
	binary.BigEndian.PutUint32(b[4:8], f.Stream)
	binary.BigEndian.PutUint32(b[8:12], uint32(len(f.Payload)))
}

// AppendFrame appends the encoding of f to dst.
func AppendFrame(dst []byte, f Frame) []byte {
	var h [HeaderSize]byte
	putHeader(h[:], &f)
	dst = append(dst, h[:]...)
	return append(dst, f.Payload...)
}

// WriteFrame writes f to w. It does not validate f beyond the payload size.
func WriteFrame(w io.Writer, f Frame) error {
	if len(f.Payload) > MaxPayload {
		return fmt.Errorf("write %s: %w: payload of %d bytes", f.Type, ErrInvalidFrame, len(f.Payload))
	}
	var h [HeaderSize]byte
	putHeader(h[:], &f)
	if _, err := w.Write(h[:]); err != nil {
		return fmt.Errorf("write %s header: %w", f.Type, err)
	}
	if len(f.Payload) == 0 {
		return nil
	}
	if _, err := w.Write(f.Payload); err != nil {
		return fmt.Errorf("write %s payload: %w", f.Type, err)
	}
	return nil
}

// ReadFrame reads one frame from r. A malformed header yields an error wrapping
// ErrInvalidFrame; a stream that ends inside a frame yields io.ErrUnexpectedEOF
// and one that ends before a frame yields io.EOF.
func ReadFrame(r io.Reader) (Frame, error) {
	var hb [HeaderSize]byte
	if _, err := io.ReadFull(r, hb[:]); err != nil {
		return Frame{}, err
	}
	h, err := parseHeader(hb[:])
	if err != nil {
		return Frame{}, err
	}
	f := Frame{Type: h.typ, Flags: h.flags, Stream: h.stream}
	if h.length > 0 {
		f.Payload = make([]byte, h.length)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}

// peeker is the part of *bufio.Reader the buffered frame readers need. The
// buffer must hold at least HeaderSize+MaxPayload bytes.
type peeker interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
}

// readFrameBuffered reads one frame from a buffered reader without consuming
// anything when the header is invalid, so a caller can resynchronize by
// discarding a single byte and scanning on.
func readFrameBuffered(br peeker) (Frame, error) {
	hb, err := br.Peek(HeaderSize)
	if err != nil {
		return Frame{}, eofAfter(len(hb), err)
	}
	h, err := parseHeader(hb)
	if err != nil {
		return Frame{}, err
	}
	total := HeaderSize + int(h.length)
	b, err := br.Peek(total)
	if err != nil {
		return Frame{}, eofAfter(1, err)
	}
	f := Frame{Type: h.typ, Flags: h.flags, Stream: h.stream}
	if h.length > 0 {
		f.Payload = make([]byte, h.length)
		copy(f.Payload, b[HeaderSize:])
	}
	if _, err := br.Discard(total); err != nil {
		return Frame{}, err
	}
	return f, nil
}

// eofAfter turns io.EOF after a partial frame into io.ErrUnexpectedEOF.
func eofAfter(n int, err error) error {
	if n > 0 && errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// scanFrame looks for a frame of type typ on stream 0 whose JSON payload
// satisfies accept, discarding bytes one at a time until it finds one. It is how
// a reader resynchronizes after a reconnection left it inside a frame.
func scanFrame(br peeker, typ FrameType, maxLen int, accept func(payload []byte) bool) (Frame, error) {
	for {
		hb, err := br.Peek(HeaderSize + 1)
		if err != nil {
			return Frame{}, err
		}
		if h, err := parseHeader(hb); err == nil && h.typ == typ && h.length >= 2 &&
			int(h.length) <= maxLen && hb[HeaderSize] == '{' {
			total := HeaderSize + int(h.length)
			b, err := br.Peek(total)
			if err != nil {
				return Frame{}, err
			}
			if accept(b[HeaderSize:]) {
				f := Frame{Type: h.typ, Stream: h.stream, Payload: append([]byte(nil), b[HeaderSize:]...)}
				if _, err := br.Discard(total); err != nil {
					return Frame{}, err
				}
				return f, nil
			}
		}
		if _, err := br.Discard(1); err != nil {
			return Frame{}, err
		}
	}
}
