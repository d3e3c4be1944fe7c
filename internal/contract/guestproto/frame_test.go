package guestproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		f    Frame
	}{
		{"hello", Frame{Type: FrameHello, Payload: []byte(`{"session":"s"}`)}},
		{"empty data", Frame{Type: FrameData, Stream: 7}},
		{"stderr data", Frame{Type: FrameData, Flags: FlagStderr, Stream: 1 << 31, Payload: []byte("oops")}},
		{"window", Frame{Type: FrameWindow, Stream: 3, Payload: []byte{0, 1, 0, 0}}},
		{"max payload", Frame{Type: FrameData, Stream: 1, Payload: bytes.Repeat([]byte{0xaa}, MaxPayload)}},
		{"barrier", Frame{Type: FrameBarrier}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, tt.f); err != nil {
				t.Fatalf("WriteFrame: %v", err)
			}
			if got, want := buf.Bytes(), AppendFrame(nil, tt.f); !bytes.Equal(got, want) {
				t.Fatalf("WriteFrame and AppendFrame differ")
			}
			got, err := ReadFrame(&buf)
			if err != nil {
				t.Fatalf("ReadFrame: %v", err)
			}
			if got.Type != tt.f.Type || got.Flags != tt.f.Flags || got.Stream != tt.f.Stream || !bytes.Equal(got.Payload, tt.f.Payload) {
				t.Errorf("got %v, want %v", got, tt.f)
			}
		})
	}
}

func TestReadFrameRejects(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"unknown type", []byte{99, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, ErrInvalidFrame},
		{"reserved set", []byte{byte(FrameData), 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}, ErrInvalidFrame},
		{"too long", []byte{byte(FrameData), 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1}, ErrInvalidFrame},
		{"session frame on stream", []byte{byte(FrameHello), 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, ErrInvalidFrame},
		{"stream frame on 0", []byte{byte(FrameData), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, ErrInvalidFrame},
		{"flag on close", []byte{byte(FrameClose), 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, ErrInvalidFrame},
		{"short window", []byte{byte(FrameWindow), 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0}, ErrInvalidFrame},
		{"empty", nil, io.EOF},
		{"short header", []byte{byte(FrameData), 0, 0}, io.ErrUnexpectedEOF},
		{"short payload", []byte{byte(FrameData), 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 4, 'a'}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.b))
			if !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzReadFrame: header parsing and the two frame readers. ReadFrame and
// the buffered reader the protocol engines use agree on every input, and
// whatever they accept re-encodes to its input.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, Frame{Type: FrameHello, Payload: []byte(`{"session":"x"}`)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		br := bufio.NewReaderSize(bytes.NewReader(b), HeaderSize+MaxPayload)
		for {
			start := int(r.Size()) - r.Len()
			fr, err := ReadFrame(r)
			bfr, berr := readFrameBuffered(br)
			if (err == nil) != (berr == nil) || errors.Is(err, ErrInvalidFrame) != errors.Is(berr, ErrInvalidFrame) {
				t.Fatalf("ReadFrame: %v, %v; buffered: %v, %v", fr, err, bfr, berr)
			}
			if err != nil {
				if !errors.Is(err, ErrInvalidFrame) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("ReadFrame error %v is none of invalid frame, EOF, unexpected EOF", err)
				}
				return
			}
			if fr.Type != bfr.Type || fr.Flags != bfr.Flags || fr.Stream != bfr.Stream || !bytes.Equal(fr.Payload, bfr.Payload) {
				t.Fatalf("ReadFrame read %v, the buffered reader %v", fr, bfr)
			}
			if len(fr.Payload) > MaxPayload {
				t.Fatalf("%v: payload over %d bytes", fr, MaxPayload)
			}
			end := int(r.Size()) - r.Len()
			if got := AppendFrame(nil, fr); !bytes.Equal(got, b[start:end]) {
				t.Fatalf("re-encoding %v differs from its input", fr)
			}
		}
	})
}
