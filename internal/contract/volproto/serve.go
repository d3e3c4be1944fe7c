package volproto

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// Handler answers one request. It is called concurrently (at most
// maxInFlight at once per Serve); the Response's ID is set by Serve.
type Handler func(ctx context.Context, req *Request) *Response

// Serve reads requests from conn and answers each with h, up to
// maxInFlight at once (reading waits while that many are being
// answered, so a connection holds at most maxInFlight requests and
// answers of at most MaxMessage bytes each). A malformed request ends
// the connection with an error wrapping ErrMessage: the stream cannot be
// trusted after it. It returns nil when conn ends cleanly (io.EOF), ctx's
// error when ctx ends (conn is closed), and waits for the requests being
// answered before returning.
func Serve(ctx context.Context, conn io.ReadWriteCloser, maxInFlight int, h Handler) error {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	var wmu sync.Mutex
	var werr error
	for {
		sem <- struct{}{}
		// Each request gets its own buffer: Data aliases it while h runs.
		body, err := ReadMessage(conn, nil)
		if err != nil {
			<-sem
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		req, err := DecodeRequest(body)
		if err != nil {
			<-sem
			conn.Close()
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp := h(ctx, req)
			resp.ID = req.ID
			b := AppendResponse(make([]byte, 0, 160+len(resp.Data)), resp)
			wmu.Lock()
			defer wmu.Unlock()
			if werr == nil {
				if _, werr = conn.Write(b); werr != nil {
					conn.Close()
				}
			}
		}()
	}
}
