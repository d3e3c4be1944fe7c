package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"testing"
	"time"
)

// TestReplyBeforeHangUp: a command that QEMU answers just before it hangs
// up (it exits, or closes the socket) gets that answer, not ErrClosed. The
// read loop ends right after handing the reply over, so both are ready when
// Execute looks; before the fix, select picked one at random. Many rounds
// make the race show.
func TestReplyBeforeHangUp(t *testing.T) {
	for i := range 200 {
		client, peer := socketPair(t)
		go func() {
			defer peer.Close()
			peer.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
			dec := json.NewDecoder(peer)
			var cmd map[string]any
			if dec.Decode(&cmd) != nil {
				return
			}
			peer.Write([]byte(`{"return": {}}` + "\n"))
			if dec.Decode(&cmd) != nil {
				return
			}
			peer.Write([]byte(`{"return": {"status": "running"}}` + "\n"))
			peer.CloseWrite()
			io.Copy(io.Discard, peer)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		cl, err := newClient(ctx, client)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var out struct{ Status string }
		err = cl.Execute(ctx, "query-status", nil, &out)
		cl.Close()
		cancel()
		if err != nil || out.Status != "running" {
			t.Fatalf("round %d: query-status answered just before the hang-up: %v, status %q; want the answer", i, err, out.Status)
		}
	}
}

// TestLongLine: a peer that sends a line longer than maxLine (a VMM taken
// over by its guest, streaming bytes without a newline) ends the
// connection: the command in flight fails with ErrClosed and Done closes,
// rather than the client buffering the line without bound.
func TestLongLine(t *testing.T) {
	client, peer := socketPair(t)
	defer peer.Close()
	go func() {
		peer.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		dec := json.NewDecoder(peer)
		var cmd map[string]any
		if dec.Decode(&cmd) != nil {
			return
		}
		peer.Write([]byte(`{"return": {}}` + "\n"))
		if dec.Decode(&cmd) != nil {
			return
		}
		junk := make([]byte, 1<<20)
		for i := range junk {
			junk[i] = 'a'
		}
		peer.Write([]byte(`{"return": "`))
		for range maxLine/len(junk) + 1 {
			if _, err := peer.Write(junk); err != nil {
				return // the client hung up
			}
		}
		// The line is longer than maxLine by now; hold it open.
		io.Copy(io.Discard, peer)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl, err := newClient(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.Execute(ctx, "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("a reply longer than %d bytes: %v, want ErrClosed", maxLine, err)
	}
	select {
	case <-cl.Done():
	case <-ctx.Done():
		t.Fatal("Done is not closed")
	}
	if !errors.Is(cl.readErr, errLineTooLong) {
		t.Fatalf("read loop ended with %v, want %v", cl.readErr, errLineTooLong)
	}
}
