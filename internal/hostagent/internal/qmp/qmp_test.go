package qmp

import (
	"bufio"
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestCancelClosesConnection: a command whose ctx ends before its reply
// closes the connection (a late reply would answer the next command) and
// Closed says so; later commands fail with ErrClosed. The peer is a
// scripted QMP server that greets, accepts capabilities and then never
// answers.
func TestCancelClosesConnection(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		br := bufio.NewReader(c)
		if _, err := br.ReadBytes('}'); err != nil {
			served <- err
			return
		}
		c.Write([]byte(`{"return": {}}` + "\n"))
		// Read the next command and never answer it; return once the
		// client hangs up.
		for {
			if _, err := br.ReadByte(); err != nil {
				served <- nil
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	if c.Closed() {
		t.Fatal("a new connection reports itself closed")
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if err := c.Execute(short, "stop", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("unanswered command: %v, want the deadline", err)
	}
	if !c.Closed() {
		t.Error("a connection left out of step by a cancelled command is not Closed")
	}
	if err := c.Execute(ctx, "cont", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("command after the cancel: %v, want ErrClosed", err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}
