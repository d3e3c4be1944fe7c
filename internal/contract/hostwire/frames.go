package hostwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Types of the frames of an exec's and an attach's answer. Stdout, stderr
// and error frames are both's.
const (
	FrameStart  byte = 'S' // JSON StartFrame; an exec's first
	FrameStdout byte = '1' // raw bytes
	FrameStderr byte = '2' // raw bytes
	FrameExit   byte = 'X' // JSON guestproto.ExecResult; an exec's last
	FrameError  byte = 'E' // JSON Error; last

	FrameAttach    byte = 'A' // JSON AttachFrame; an attach's first
	FrameAttachEnd byte = 'X' // JSON AttachEndFrame; an attach's last
)

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// ReadFrame reads one frame from r: its type and payload, in buf if it
// is large enough. A stream that ends before a frame's end is
// io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, buf []byte) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, nil, io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("exec frame of %d bytes exceeds %d", n, MaxFrame)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		return 0, nil, err
	}
	return hdr[0], buf, nil
}

// AppendFrame appends a frame of type typ with payload to dst.
func AppendFrame(dst []byte, typ byte, payload []byte) []byte {
	dst = append(dst, typ, 0, 0, 0, 0)
	binary.BigEndian.PutUint32(dst[len(dst)-4:], uint32(len(payload)))
	return append(dst, payload...)
}

// JSONFrame is a frame of type typ whose payload is v as JSON.
func JSONFrame(typ byte, v any) []byte {
	b, _ := json.Marshal(v)
	return AppendFrame(nil, typ, b)
}

// MaxLine bounds the JSON line that begins an exec request or a download,
// newline included: 4 MiB, above what any REST request within the REST
// API's 1 MiB body limit becomes (the line is encoded without HTML
// escapes, so a string grows at most twice: U+2028 to \u2028).
const MaxLine = 4 << 20

// ErrLineTooLong: a JSON line longer than MaxLine.
var ErrLineTooLong = fmt.Errorf("JSON line longer than %d bytes", MaxLine)

// EncodeLine encodes v as one JSON line, without HTML escapes.
func EncodeLine(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // with the newline
		return nil, err
	}
	return b.Bytes(), nil
}

// ReadJSONLine decodes the JSON line, of at most MaxLine bytes, that
// begins a stream. The reader's buffer may be smaller than the line.
func ReadJSONLine(r *bufio.Reader, v any) error {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > MaxLine {
			return ErrLineTooLong
		}
		line = append(line, frag...)
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return json.Unmarshal(line, v)
}

// SourceReader remembers the failure (not EOF) of the reader it wraps, to
// tell a failed source from a failed destination after io.Copy, or an
// upload's source from the transport.
type SourceReader struct {
	R   io.Reader
	Err error // R's last failure, io.EOF excepted
}

func (s *SourceReader) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	// io.EOF itself, not an error that wraps it: "guest connection closed:
	// read guest frame: EOF" is a failure (a download cut short), not the
	// file's end.
	if err != nil && err != io.EOF {
		s.Err = err
	}
	return n, err
}
