package qmp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// FuzzClient plays a QMP peer (a QEMU that may be broken or hostile: the
// VMM is what a guest escape takes over) that answers the greeting, the
// client's qmp_capabilities and one command with arbitrary bytes, and
// holds the client to a model of the protocol: the first line is the
// greeting; every later line that decodes as a reply object is an event
// (if it names one) or the answer to the command in flight; anything else
// is skipped. So it checks that the client never panics or hangs, that
// Dial-time negotiation succeeds exactly when the peer's lines say so,
// that a command gets the first answer after it (its error as an *Error,
// its return value decoded, or ErrClosed when the peer hangs up), and that
// events arrive in order, the first 64 of them when nobody reads.
//
// Each of the three inputs is what the peer writes at one turn; a turn
// that does not end in a newline gets one, so that no line spans two
// turns (the client reads lines; a partial one waits for its end).
func FuzzClient(f *testing.F) {
	greet := `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 8}, "package": "Debian 1:8.2.2"}, "capabilities": ["oob"]}}` + "\n"
	ok := `{"return": {}}` + "\n"
	status := `{"return": {"status": "running", "singlestep": false, "running": true}}` + "\n"
	stop := `{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": "STOP"}` + "\n"
	resume := `{"timestamp": {"seconds": 1700000001, "microseconds": 6}, "event": "RESUME", "data": {"reason": "x"}}` + "\n"
	for _, s := range [][3]string{
		{greet, ok, status},
		{greet, stop + ok, resume + status},
		{greet, ok, `{"error": {"class": "GenericError", "desc": "this feature or command is not currently supported"}}`},
		{greet, `{"error": {"class": "CommandNotFound", "desc": "x"}}`, status},
		{greet + ok, "", status},                     // a reply before the command: it answers it
		{greet + ok + ok, "", status},                // two early replies: the second is stale
		{greet, "garbage\n" + ok, "{\n" + status},    // lines that do not decode are skipped
		{greet, ok, `{"return": [1, 2]}`},            // a return value of the wrong shape
		{greet, ok, `{"return": "running"}`},         // another
		{greet, ok, "null\n"},                        // decodes: a reply without a value
		{greet, ok, `{"return": {}, "id": "x"}`},     // ids are ignored
		{greet, ok, `{"event": "", "return": {}}`},   // an empty event name is a reply
		{greet, ok, ""},                              // no answer: the peer hangs up
		{greet, "", ""},                              // no answer to the negotiation
		{`{"QMP": null}`, ok, status},                // a null greeting
		{`{"qmp": {}}`, ok, status},                  // not a greeting
		{"", ok, status},                             // nothing
		{`{"QMP": {}}` + "\r", ok + ok + ok, status}, // a carriage return before the newline
		{greet, `{"return": {"status": 1}}` + "\n" + stop + stop + stop, status + status},
	} {
		f.Add([]byte(s[0]), []byte(s[1]), []byte(s[2]))
	}
	f.Fuzz(func(t *testing.T, g, c, r []byte) {
		g, c, r = endLine(g), endLine(c), endLine(r)
		m := modelSession(g, c, r)

		client, peer := socketPair(t)
		defer peer.Close()
		peerDone := make(chan error, 1)
		go func() { peerDone <- playPeer(peer, m, g, c, r) }()

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cl, err := newClient(ctx, client)
		switch {
		case !m.greetOK:
			client.Close()
			if err == nil {
				t.Fatalf("greeting %q accepted, want an error", firstLine(g))
			}
		case m.capsClosed:
			client.Close()
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("negotiation the peer never answered: %v, want ErrClosed", err)
			}
		case m.caps.Error != nil:
			client.Close()
			var qe *Error
			if !errors.As(err, &qe) || *qe != *m.caps.Error {
				t.Fatalf("negotiation answered with error %+v: got %v", *m.caps.Error, err)
			}
		case err != nil:
			t.Fatalf("negotiation answered %q: %v", m.capsLine, err)
		}
		if err != nil {
			if perr := <-peerDone; perr != nil {
				t.Fatal(perr)
			}
			return
		}
		defer cl.Close()

		var out map[string]any
		err = cl.Execute(ctx, "query-status", map[string]any{"verbose": true}, &out)
		if ctx.Err() != nil {
			t.Fatalf("the command did not return within 10s: %v", err)
		}
		if m.stale {
			// An earlier turn answered twice: which answer this command
			// gets depends on timing. It returned; that is all to check.
			cl.Close()
			<-peerDone
			return
		}
		switch {
		case m.cmd == nil:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("a command the peer never answered: %v, want ErrClosed", err)
			}
		case m.cmd.Error != nil:
			var qe *Error
			if !errors.As(err, &qe) || *qe != *m.cmd.Error {
				t.Fatalf("command answered with error %+v: got %v", *m.cmd.Error, err)
			}
		default:
			var want map[string]any
			var werr error
			if len(m.cmd.Return) > 0 {
				werr = json.Unmarshal(m.cmd.Return, &want)
			}
			if (err != nil) != (werr != nil) {
				t.Fatalf("command answered %q: got error %v, want %v", m.cmdLine, err, werr)
			}
			if err == nil && !reflect.DeepEqual(out, want) {
				t.Fatalf("command answered %q: decoded %v, want %v", m.cmdLine, out, want)
			}
		}
		// The peer hangs up after its last turn: the connection ends, and
		// the events it sent are there, in order, the first 64 of them
		// (nobody read them meanwhile).
		select {
		case <-cl.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the peer hung up, but Done is not closed after 10s")
		}
		if !cl.Closed() {
			t.Fatal("Closed is false after the connection ended")
		}
		var got []Event
		for ev := range cl.Events() {
			got = append(got, ev)
		}
		want := m.events
		if len(want) > cap(cl.events) {
			want = want[:cap(cl.events)]
		}
		if len(got) != len(want) {
			t.Fatalf("got %d events, want %d", len(got), len(want))
		}
		for i := range got {
			if got[i].Name != want[i].Name || !bytes.Equal(got[i].Data, want[i].Data) {
				t.Fatalf("event %d: got %+v, want %+v", i, got[i], want[i])
			}
		}
		if err := cl.Execute(ctx, "cont", nil, nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("command after the connection ended: %v, want ErrClosed", err)
		}
		cl.Close()
		if perr := <-peerDone; perr != nil {
			t.Fatal(perr)
		}
	})
}

// session is what the model expects of a peer's three turns.
type session struct {
	greetOK bool
	// capsClosed: no line before the end of the second turn answers the
	// negotiation (the peer hangs up then).
	capsClosed bool
	caps       reply
	capsLine   []byte
	// cmd is the answer to the command (nil: none, the peer hangs up);
	// stale that an earlier turn held a second answer, which may answer
	// the command instead.
	cmd     *reply
	cmdLine []byte
	stale   bool
	events  []Event
}

// modelSession decides what a client should make of the turns g, c and r
// (each ending in a newline).
func modelSession(g, c, r []byte) session {
	var m session
	line, rest, _ := bytes.Cut(g, []byte("\n"))
	var greet struct {
		QMP json.RawMessage `json:"QMP"`
	}
	m.greetOK = json.Unmarshal(append(line, '\n'), &greet) == nil && greet.QMP != nil
	if !m.greetOK {
		return m
	}
	// Lines of a turn, each classified as the client's read loop does.
	type item struct {
		line  []byte
		reply reply
	}
	turn := func(b []byte) (replies []item) {
		for _, l := range bytes.SplitAfter(b, []byte("\n")) {
			if len(l) == 0 {
				continue
			}
			var rp reply
			if json.Unmarshal(l, &rp) != nil {
				continue
			}
			if rp.Event != "" {
				m.events = append(m.events, Event{Name: rp.Event, Data: rp.Data})
				continue
			}
			replies = append(replies, item{l, rp})
		}
		return replies
	}
	early := append(turn(rest), turn(c)...)
	if len(early) == 0 {
		m.capsClosed = true
		return m
	}
	m.caps, m.capsLine = early[0].reply, early[0].line
	m.stale = len(early) > 1
	if late := turn(r); len(late) > 0 {
		m.cmd, m.cmdLine = &late[0].reply, late[0].line
	}
	return m
}

// playPeer writes the turns of m to conn: the greeting, then each answer
// once the client's command for it has arrived; it hangs up where the
// model says the client waits for nothing more, and returns what went
// wrong on its side.
func playPeer(conn *net.UnixConn, m session, g, c, r []byte) error {
	defer conn.Close()
	if _, err := conn.Write(g); err != nil || !m.greetOK {
		io.Copy(io.Discard, conn)
		return nil
	}
	dec := json.NewDecoder(conn)
	var cmd struct {
		Execute   string         `json:"execute"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := dec.Decode(&cmd); err != nil {
		return nil // the client gave up (an answer in the greeting's turn failed it)
	}
	if cmd.Execute != "qmp_capabilities" || cmd.Arguments != nil {
		return errors.New("the client's first command is not a bare qmp_capabilities")
	}
	if _, err := conn.Write(c); err != nil || m.capsClosed {
		return nil
	}
	cmd.Execute, cmd.Arguments = "", nil
	if err := dec.Decode(&cmd); err != nil {
		return nil // the negotiation failed: the client hung up
	}
	if cmd.Execute != "query-status" || !reflect.DeepEqual(cmd.Arguments, map[string]any{"verbose": true}) {
		return errors.New("the client sent another command than it was asked to")
	}
	conn.Write(r)
	conn.CloseWrite()
	io.Copy(io.Discard, conn)
	return nil
}

// socketPair returns the two ends of a connected unix stream socket pair.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "qmp")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1]
}

func endLine(b []byte) []byte {
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return append(b[:len(b):len(b)], '\n')
	}
	return b
}

func firstLine(b []byte) []byte {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return line
}
