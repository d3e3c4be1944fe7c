package guestproto_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestValidateVolumeMounts(t *testing.T) {
	ok := []guestproto.VolumeMount{{Tag: "vol_abc", Path: "/mnt/data"}, {Tag: "b.2-x", Path: "/home/user/b", ReadOnly: true}}
	if err := guestproto.ValidateVolumeMounts(ok); err != nil {
		t.Errorf("valid mounts: %v", err)
	}
	if err := guestproto.ValidateVolumeMounts(nil); err != nil {
		t.Errorf("no mounts: %v", err)
	}
	many := make([]guestproto.VolumeMount, guestproto.MaxVolumeMounts+1)
	for i := range many {
		many[i] = guestproto.VolumeMount{Tag: string(rune('a' + i)), Path: "/m/" + string(rune('a'+i))}
	}
	for name, mounts := range map[string][]guestproto.VolumeMount{
		"relative":   {{Tag: "a", Path: "mnt"}},
		"root":       {{Tag: "a", Path: "/"}},
		"unclean":    {{Tag: "a", Path: "/mnt/../etc"}},
		"empty tag":  {{Tag: "", Path: "/mnt"}},
		"tag chars":  {{Tag: "a/b", Path: "/mnt"}},
		"long tag":   {{Tag: strings.Repeat("a", guestproto.MaxVolumeTagLen+1), Path: "/mnt"}},
		"same tag":   {{Tag: "a", Path: "/x"}, {Tag: "a", Path: "/y"}},
		"same path":  {{Tag: "a", Path: "/x"}, {Tag: "b", Path: "/x"}},
		"nested":     {{Tag: "a", Path: "/x"}, {Tag: "b", Path: "/x/y"}},
		"nested rev": {{Tag: "a", Path: "/x/y"}, {Tag: "b", Path: "/x"}},
		"too many":   many,
	} {
		if err := guestproto.ValidateVolumeMounts(mounts); !errors.Is(err, guestproto.ErrInvalid) {
			t.Errorf("%s: %v, want code invalid", name, err)
		}
	}
	// Prefixes that are not parents are not overlaps.
	if err := guestproto.ValidateVolumeMounts([]guestproto.VolumeMount{{Tag: "a", Path: "/x"}, {Tag: "b", Path: "/xy"}}); err != nil {
		t.Errorf("/x and /xy: %v", err)
	}
}

// TestVolumesOldAgent: an agent that does not list FeatureVolumes gets
// nothing; the error matches errors.ErrUnsupported.
func TestVolumesOldAgent(t *testing.T) {
	c, p := newPeer(t, guestproto.ClientConfig{}, nil)
	_, err := c.OpenVolumes(testContext(t), []guestproto.VolumeMount{{Tag: "a", Path: "/mnt"}})
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "too old") {
		t.Errorf("OpenVolumes on an old agent = %v, want errors.ErrUnsupported saying it is too old", err)
	}
	if _, err := c.OpenVolumes(testContext(t), []guestproto.VolumeMount{{Tag: "a", Path: "rel"}}); !errors.Is(err, guestproto.ErrInvalid) {
		t.Errorf("OpenVolumes of a relative path = %v, want code invalid", err)
	}
	select {
	case f := <-p.frames:
		t.Errorf("the agent got a frame %v", f.Type)
	default:
	}
}

// TestOpenVolumesPeer: the OPEN carries the mounts; the guest's error
// REPLY is OpenVolumes' error; after REPLY {} the stream carries bytes
// both ways.
func TestOpenVolumesPeer(t *testing.T) {
	c, p := newPeerFeatures(t, guestproto.ClientConfig{}, nil, guestproto.FeatureVolumes)
	mounts := []guestproto.VolumeMount{{Tag: "v1", Path: "/mnt/a", ReadOnly: true}}
	type result struct {
		conn net.Conn
		err  error
	}
	open := func() (guestproto.Frame, chan result) {
		done := make(chan result, 1)
		go func() {
			conn, err := c.OpenVolumes(context.Background(), mounts)
			done <- result{conn, err}
		}()
		f := p.waitFor(guestproto.FrameOpen, 0)
		var req guestproto.OpenRequest
		if err := json.Unmarshal(f.Payload, &req); err != nil || req.Op != guestproto.OpVolumes || len(req.Volumes) != 1 || req.Volumes[0] != mounts[0] {
			t.Fatalf("OPEN %s (%v), want op volumes with %+v", f.Payload, err, mounts)
		}
		return f, done
	}
	f, done := open()
	p.sendJSON(guestproto.FrameReply, f.Stream, guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInternal, "no FUSE")})
	if r := await(t, done, testTimeout, "OpenVolumes"); r.err == nil || !strings.Contains(r.err.Error(), "no FUSE") {
		t.Errorf("OpenVolumes answered an error: %v", r.err)
	}
	f, done = open()
	p.sendJSON(guestproto.FrameReply, f.Stream, guestproto.Reply{})
	r := await(t, done, testTimeout, "OpenVolumes")
	if r.err != nil {
		t.Fatalf("OpenVolumes: %v", r.err)
	}
	defer r.conn.Close()
	if r.conn.RemoteAddr().String() != "volumes" {
		t.Errorf("RemoteAddr %v, want volumes", r.conn.RemoteAddr())
	}
	p.send(guestproto.Frame{Type: guestproto.FrameData, Stream: f.Stream, Payload: []byte("from guest")})
	buf := make([]byte, 64)
	n, err := r.conn.Read(buf)
	if err != nil || string(buf[:n]) != "from guest" {
		t.Errorf("Read: %q, %v", buf[:n], err)
	}
	p.send(guestproto.Frame{Type: guestproto.FrameWindow, Stream: f.Stream, Payload: binary.BigEndian.AppendUint32(nil, 1<<10)})
	if _, err := r.conn.Write([]byte("from host")); err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(testTimeout, func() bool { return p.received.Load() == int64(len("from host")) }) {
		t.Errorf("the guest received %d bytes, want %d", p.received.Load(), len("from host"))
	}
}

// TestOpenVolumesAgent: end to end through an Agent whose handler echoes
// the volume stream; a second OpenVolumes works while the first is open.
func TestOpenVolumesAgent(t *testing.T) {
	tr := guestprototest.New()
	agent := guestproto.NewAgent(tr, volumesEcho{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() { cancel(); _ = tr.Close(); <-done })
	c := guestproto.NewClient(tr.Connect(true))
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Hello(testContext(t), guestproto.HelloRequest{Session: "v", Entropy: make([]byte, guestproto.MinEntropy)}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		conn, err := c.OpenVolumes(testContext(t), []guestproto.VolumeMount{{Tag: "v", Path: "/mnt/v"}})
		if err != nil {
			t.Fatalf("OpenVolumes: %v", err)
		}
		defer conn.Close()
		msg := bytes.Repeat([]byte("volproto"), 100<<10) // beyond a window of credit
		go conn.Write(msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("echo through the volume stream: %v", err)
		}
	}
}

// volumesEcho is an agent whose volume streams echo.
type volumesEcho struct{}

func (volumesEcho) Hello(context.Context, *guestproto.HelloRequest) guestproto.HelloReply {
	return guestproto.HelloReply{AgentVersion: "test", Features: []string{guestproto.FeatureVolumes}}
}

func (volumesEcho) ServeStream(ctx context.Context, s *guestproto.Stream, req *guestproto.OpenRequest) {
	if req.Op != guestproto.OpVolumes || guestproto.ValidateVolumeMounts(req.Volumes) != nil {
		_ = s.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInvalid, "bad request")})
		return
	}
	conn, server := net.Pipe()
	go func() { _, _ = io.Copy(server, server); server.Close() }()
	guestproto.ServeConn(ctx, s, conn)
}
