package volproto_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"reflect"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/volproto"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []*volproto.Request{
		{ID: 1, Op: volproto.OpLookup, Tag: "t", Path: ""},
		{ID: 2, Op: volproto.OpWrite, Tag: "vol_x", Path: "a/b", Offset: 1 << 40, Data: bytes.Repeat([]byte{7}, volproto.MaxData)},
		{ID: 3, Op: volproto.OpRename, Tag: "t", Path: "a", Path2: "b/c", Flags: volproto.FlagNoReplace | volproto.FlagRetry},
		{ID: 4, Op: volproto.OpSetattr, Tag: "t", Path: "f", Flags: volproto.SetMode | volproto.SetAtime, Mode: 0o644, Atime: -5, Mtime: 9, UID: 1, GID: 2},
		{ID: ^uint64(0), Op: volproto.OpSymlink, Tag: "t", Path: "l", Path2: "/etc/passwd"},
	} {
		b := volproto.AppendRequest(nil, r)
		body, err := volproto.ReadMessage(bytes.NewReader(b), nil)
		if err != nil {
			t.Fatalf("%v: ReadMessage: %v", r.Op, err)
		}
		got, err := volproto.DecodeRequest(body)
		if err != nil {
			t.Fatalf("%v: DecodeRequest: %v", r.Op, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("%v: got %+v, want %+v", r.Op, got, r)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for _, r := range []*volproto.Response{
		{ID: 1, Errno: syscall.ENOSPC},
		{ID: 2, HasAttr: true, Attr: volproto.Attr{Ino: 9, Mode: syscall.S_IFREG | 0o644, Nlink: 1, Size: 5, Blocks: 8, Atime: 1, Mtime: 2, Ctime: 3}, N: 5},
		{ID: 3, Data: []byte("hello"), N: 7, M: 1},
	} {
		b := volproto.AppendResponse(nil, r)
		body, err := volproto.ReadMessage(bytes.NewReader(b), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := volproto.DecodeResponse(body)
		if err != nil {
			t.Fatalf("DecodeResponse: %v", err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("got %+v, want %+v", got, r)
		}
	}
}

// TestDecodeRejects: malformed or unbounded messages are errors of
// ErrMessage, never a panic or a huge allocation.
func TestDecodeRejects(t *testing.T) {
	good := volproto.AppendRequest(nil, &volproto.Request{ID: 1, Op: volproto.OpLookup, Tag: "t", Path: "a"})[4:]
	mutate := func(f func(r *volproto.Request)) []byte {
		r := &volproto.Request{ID: 1, Op: volproto.OpLookup, Tag: "t", Path: "a"}
		f(r)
		return volproto.AppendRequest(nil, r)[4:]
	}
	for name, body := range map[string][]byte{
		"truncated":       good[:len(good)-1],
		"trailing":        append(append([]byte(nil), good...), 0),
		"unknown op":      mutate(func(r *volproto.Request) { r.Op = 200 }),
		"no tag":          mutate(func(r *volproto.Request) { r.Tag = "" }),
		"dotdot":          mutate(func(r *volproto.Request) { r.Path = "a/../../etc" }),
		"absolute":        mutate(func(r *volproto.Request) { r.Path = "/etc" }),
		"unclean":         mutate(func(r *volproto.Request) { r.Path = "a//b" }),
		"nul":             mutate(func(r *volproto.Request) { r.Path = "a\x00b" }),
		"negative offset": mutate(func(r *volproto.Request) { r.Op = volproto.OpRead; r.Offset = -1 }),
		"huge read":       mutate(func(r *volproto.Request) { r.Op = volproto.OpRead; r.Size = volproto.MaxData + 1 }),
		"rename to root":  mutate(func(r *volproto.Request) { r.Op = volproto.OpRename; r.Path2 = "" }),
		"data on lookup":  mutate(func(r *volproto.Request) { r.Data = []byte("x") }),
		"mkdir of root":   mutate(func(r *volproto.Request) { r.Op = volproto.OpMkdir; r.Path = "" }),
	} {
		if _, err := volproto.DecodeRequest(body); !errors.Is(err, volproto.ErrMessage) {
			t.Errorf("%s: DecodeRequest: %v, want ErrMessage", name, err)
		}
	}
	// A length beyond MaxMessage is refused before reading the body.
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], volproto.MaxMessage+1)
	if _, err := volproto.ReadMessage(bytes.NewReader(hdr[:]), nil); !errors.Is(err, volproto.ErrMessage) {
		t.Errorf("oversized message: %v, want ErrMessage", err)
	}
	// An unknown errno becomes EIO; an error with a result is malformed.
	b := volproto.AppendResponse(nil, &volproto.Response{ID: 1, Errno: 9999})[4:]
	if r, err := volproto.DecodeResponse(b); err != nil || r.Errno != syscall.EIO {
		t.Errorf("unknown errno: %v, %v; want EIO", r, err)
	}
	b = volproto.AppendResponse(nil, &volproto.Response{ID: 1, Errno: syscall.ENOENT, Data: []byte("x")})[4:]
	if _, err := volproto.DecodeResponse(b); !errors.Is(err, volproto.ErrMessage) {
		t.Errorf("error with data: %v, want ErrMessage", err)
	}
}

func TestDirents(t *testing.T) {
	want := []volproto.Dirent{{Name: "a", Mode: syscall.S_IFDIR, Ino: 1, Off: 10}, {Name: "b.txt", Mode: syscall.S_IFREG, Ino: 2, Off: 20}}
	var b []byte
	for _, e := range want {
		b = volproto.AppendDirent(b, e)
	}
	got, err := volproto.DecodeDirents(b)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("DecodeDirents: %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"..", ".", "a/b", ""} {
		if _, err := volproto.DecodeDirents(volproto.AppendDirent(nil, volproto.Dirent{Name: bad})); err == nil {
			t.Errorf("DecodeDirents of an entry named %q: no error", bad)
		}
	}
}

// echo answers every request with its path as data.
func echo(ctx context.Context, r *volproto.Request) *volproto.Response {
	return &volproto.Response{Data: []byte(r.Path), N: int64(r.Flags)}
}

// TestClientServe: many requests outstanding at once are each answered
// with their own response.
func TestClientServe(t *testing.T) {
	c := volproto.NewClient()
	g, h := net.Pipe()
	clientDone, serverDone := make(chan error, 1), make(chan error, 1)
	go func() { clientDone <- c.Serve(g) }()
	go func() { serverDone <- volproto.Serve(context.Background(), h, 4, echo) }()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := string(rune('a'+i%26)) + "/" + string(rune('a'+i/26))
			r, err := c.Do(context.Background(), &volproto.Request{Op: volproto.OpLookup, Tag: "t", Path: p})
			if err != nil || string(r.Data) != p {
				t.Errorf("Do %s: %v, %q", p, err, r.Data)
			}
		}()
	}
	wg.Wait()
	g.Close()
	if err := <-serverDone; err != nil {
		t.Errorf("volproto.Serve after the guest closed: %v, want nil", err)
	}
	<-clientDone
}

// TestClientResends: a request waits while no stream is attached; one
// outstanding when its stream ends is re-sent, marked FlagRetry, on the
// next.
func TestClientResends(t *testing.T) {
	c := volproto.NewClient()
	type result struct {
		r   *volproto.Response
		err error
	}
	res := make(chan result, 1)
	go func() {
		r, err := c.Do(context.Background(), &volproto.Request{Op: volproto.OpMkdir, Tag: "t", Path: "d"})
		res <- result{r, err}
	}()
	// No stream: the request waits. Attach one that reads it and dies.
	g, h := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- c.Serve(g) }()
	body, err := volproto.ReadMessage(h, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := volproto.DecodeRequest(body)
	if err != nil || first.Flags&volproto.FlagRetry != 0 {
		t.Fatalf("first send: %+v, %v; want no FlagRetry", first, err)
	}
	h.Close()
	if err := <-served; err != nil && !errors.Is(err, io.ErrClosedPipe) {
		t.Logf("first stream ended: %v", err)
	}
	select {
	case r := <-res:
		t.Fatalf("request answered without a stream: %+v", r)
	default:
	}
	g2, h2 := net.Pipe()
	go func() { served <- c.Serve(g2) }()
	var got *volproto.Request
	go volproto.Serve(context.Background(), h2, 1, func(ctx context.Context, r *volproto.Request) *volproto.Response {
		got = r
		return &volproto.Response{}
	})
	select {
	case r := <-res:
		if r.err != nil || r.r.Errno != 0 {
			t.Fatalf("re-sent request: %+v, %v", r.r, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("re-sent request never answered")
	}
	if got.ID != first.ID || got.Flags&volproto.FlagRetry == 0 {
		t.Errorf("re-sent request %+v: want id %d with FlagRetry", got, first.ID)
	}
	if n := c.Outstanding(); n != 0 {
		t.Errorf("Outstanding = %d, want 0", n)
	}
	h2.Close()
}

// TestClientCancel: a request whose ctx ends returns EINTR and is
// forgotten; its late answer is dropped.
func TestClientCancel(t *testing.T) {
	c := volproto.NewClient()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Do(ctx, &volproto.Request{Op: volproto.OpLookup, Tag: "t"})
		errc <- err
	}()
	cancel()
	if err := <-errc; err != syscall.EINTR {
		t.Errorf("canceled Do: %v, want EINTR", err)
	}
	if n := c.Outstanding(); n != 0 {
		t.Errorf("Outstanding = %d, want 0", n)
	}
}

// TestServeRejectsMalformed: a malformed request ends Serve with
// ErrMessage and closes the connection.
func TestServeRejectsMalformed(t *testing.T) {
	g, h := net.Pipe()
	errc := make(chan error, 1)
	go func() { errc <- volproto.Serve(context.Background(), h, 2, echo) }()
	b := volproto.AppendRequest(nil, &volproto.Request{ID: 1, Op: volproto.OpLookup, Tag: "t", Path: "../x"})
	go g.Write(b)
	if err := <-errc; !errors.Is(err, volproto.ErrMessage) {
		t.Errorf("Serve: %v, want ErrMessage", err)
	}
	if _, err := g.Read(make([]byte, 1)); err == nil {
		t.Error("connection still open after a malformed request")
	}
}

// FuzzVolproto: no input crashes the decoders, and what decodes encodes
// back to the same message.
func FuzzVolproto(f *testing.F) {
	f.Add(volproto.AppendRequest(nil, &volproto.Request{ID: 1, Op: volproto.OpWrite, Tag: "t", Path: "a/b", Data: []byte("x")})[4:])
	f.Add(volproto.AppendResponse(nil, &volproto.Response{ID: 1, HasAttr: true, Data: []byte("y")})[4:])
	f.Add(volproto.AppendDirent(nil, volproto.Dirent{Name: "n", Ino: 3}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := volproto.DecodeRequest(b); err == nil {
			if got := volproto.AppendRequest(nil, r)[4:]; !bytes.Equal(got, b) {
				t.Errorf("request re-encodes differently")
			}
		}
		if r, err := volproto.DecodeResponse(b); err == nil {
			again, err := volproto.DecodeResponse(volproto.AppendResponse(nil, r)[4:])
			if err != nil || !reflect.DeepEqual(again, r) {
				t.Errorf("response re-decodes differently: %+v, %v; want %+v", again, err, r)
			}
		}
		_, _ = volproto.DecodeDirents(b)
		_, _ = volproto.ReadMessage(bytes.NewReader(b), nil)
	})
}
