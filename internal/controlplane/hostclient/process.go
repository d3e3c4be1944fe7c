package hostclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// The remote guest keeps background processes and
// watches directories, as the local one does.
var _ host.ProcessGuest = guest{}

func pidPath(pid int, rest string) string { return "/processes/" + strconv.Itoa(pid) + rest }

func (g guest) StartProcess(ctx context.Context, req guestproto.ExecRequest) (guestproto.ProcInfo, error) {
	var p guestproto.ProcInfo
	err := g.call(ctx, http.MethodPost, "/processes", nil, req, &p)
	return p, err
}

func (g guest) ListProcesses(ctx context.Context) ([]guestproto.ProcInfo, error) {
	var out struct {
		Processes []guestproto.ProcInfo `json:"processes"`
	}
	err := g.call(ctx, http.MethodGet, "/processes", nil, nil, &out)
	return out.Processes, err
}

// WriteProcessStdin writes p in requests of at most MaxStdinBody bytes.
func (g guest) WriteProcessStdin(ctx context.Context, pid int, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), hostwire.MaxStdinBody)
		if err := g.stdin(ctx, pid, p[:n], false); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

func (g guest) CloseProcessStdin(ctx context.Context, pid int) error {
	return g.stdin(ctx, pid, nil, true)
}

func (g guest) stdin(ctx context.Context, pid int, data []byte, close bool) error {
	var q url.Values
	if close {
		q = url.Values{"close": {"true"}}
	}
	req, err := g.c.request(ctx, http.MethodPost, sandboxPath(g.id, pidPath(pid, "/stdin")), q, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := g.c.do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, res.Body)
	return res.Body.Close()
}

func (g guest) SignalProcess(ctx context.Context, pid int, signal string) error {
	return g.call(ctx, http.MethodPost, pidPath(pid, "/signal"), nil, hostwire.SignalRequest{Signal: signal}, nil)
}

func (g guest) ResizeProcess(ctx context.Context, pid, rows, cols int) error {
	return g.call(ctx, http.MethodPost, pidPath(pid, "/resize"), nil, hostwire.ResizeRequest{Rows: rows, Cols: cols}, nil)
}

func (g guest) RemoveProcess(ctx context.Context, pid int) error {
	return g.call(ctx, http.MethodDelete, pidPath(pid, ""), nil, nil, nil)
}

// WaitProcess holds one request open until the process exits or ctx ends.
func (g guest) WaitProcess(ctx context.Context, pid int) (guestproto.ProcInfo, error) {
	var p guestproto.ProcInfo
	err := g.call(ctx, http.MethodPost, pidPath(pid, "/wait"), nil, nil, &p)
	return p, err
}

// AttachProcess streams the process's output; see the package
// documentation. Cancelling ctx or Close detaches.
func (g guest) AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error) {
	ctx, cancel := context.WithCancel(ctx)
	q := url.Values{"stdout_offset": {strconv.FormatInt(stdoutOffset, 10)}, "stderr_offset": {strconv.FormatInt(stderrOffset, 10)}}
	req, err := g.c.request(ctx, http.MethodGet, sandboxPath(g.id, pidPath(pid, "/attach")), q, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	res, err := g.c.do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	typ, payload, err := hostwire.ReadFrame(res.Body, nil)
	if err != nil || typ != hostwire.FrameAttach {
		res.Body.Close()
		cancel()
		if err == nil {
			err = fmt.Errorf("attach stream began with frame %q", typ)
		}
		return nil, g.c.transportError(ctx, err)
	}
	var st hostwire.AttachFrame
	if err := json.Unmarshal(payload, &st); err != nil {
		res.Body.Close()
		cancel()
		return nil, fmt.Errorf("attach process %d: decode start: %w", pid, err)
	}
	at := &attachment{done: make(chan struct{})}
	stdout, stdoutW := io.Pipe()
	stderr, stderrW := io.Pipe()
	go at.demux(g.c, ctx, res.Body, stdoutW, stderrW)
	return guestproto.NewAttachment(st.Start, st.Proc, stdout, stderr, at.end, func() {
		cancel()
		// Unblocks demux if nobody reads the output any more.
		detached := guestproto.Errorf(guestproto.CodeCanceled, "detached by host")
		stdout.CloseWithError(detached)
		stderr.CloseWithError(detached)
	}), nil
}

// attachment is a remote attach's end.
type attachment struct {
	done chan struct{}
	end_ hostwire.AttachEndFrame
	err  error
}

func (a *attachment) end() (guestproto.ProcInfo, bool, error) {
	<-a.done
	return a.end_.Proc, a.end_.Lagged, a.err
}

// demux reads the response until the attach end or error frame.
func (a *attachment) demux(c *Client, ctx context.Context, body io.ReadCloser, stdout, stderr *io.PipeWriter) {
	defer close(a.done)
	a.err = demuxFrames(c, ctx, "attach process", body, stdout, stderr, hostwire.FrameAttachEnd, func(payload []byte) error {
		if err := json.Unmarshal(payload, &a.end_); err != nil {
			return fmt.Errorf("decode end: %w", err)
		}
		return nil
	})
}

// WatchDir watches a directory on the guest; see guestproto.Client.WatchDir
// for the contract. Cancelling ctx or Close ends the watch.
func (g guest) WatchDir(ctx context.Context, path string, recursive bool) (*guestproto.DirWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	q := pathQuery(path)
	q.Set("recursive", strconv.FormatBool(recursive))
	req, err := g.c.request(ctx, http.MethodGet, sandboxPath(g.id, "/watch"), q, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	res, err := g.c.do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 0, 4<<10), 64<<10)
	var ended error // sticky: the watch's end
	next := func() (guestproto.WatchEvent, error) {
		if ended != nil {
			return guestproto.WatchEvent{}, ended
		}
		if !sc.Scan() {
			ended = sc.Err()
			if ended == nil {
				ended = io.ErrUnexpectedEOF
			}
			ended = g.c.transportError(ctx, fmt.Errorf("watch %s: %w", path, ended))
			return guestproto.WatchEvent{}, ended
		}
		var l hostwire.WatchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			ended = fmt.Errorf("watch %s: malformed event: %w", path, err)
			return guestproto.WatchEvent{}, ended
		}
		switch l.Type {
		case hostwire.WatchEnd:
			ended = io.EOF
			return guestproto.WatchEvent{}, ended
		case hostwire.WatchError:
			ended = errors.New("watch ended")
			if l.Error != nil {
				ended = l.Error.Err()
			}
			return guestproto.WatchEvent{}, ended
		}
		return l.WatchEvent, nil
	}
	return guestproto.NewDirWatch(next, func() error {
		cancel()
		return res.Body.Close()
	}), nil
}
