package hostclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// Guest returns the guest agent of sandbox id. It does not call the agent:
// a sandbox that is missing or not running fails the first operation, with
// the error the local host would have returned here.
func (c *Client) Guest(_ context.Context, id string) (host.Guest, error) {
	return guest{c: c, id: id, files: files{c: c, base: sandboxPath(id)}}, nil
}

type guest struct {
	c  *Client
	id string
	files
}

// files is the files API under base: a sandbox's guest (…/sandboxes/{id})
// or a volume (…/volumes/{id}).
type files struct {
	c    *Client
	base string
}

func (f files) call(ctx context.Context, method, rest string, q url.Values, in, out any) error {
	return f.c.call(ctx, method, f.base+rest, q, in, out)
}

func pathQuery(p string) url.Values { return url.Values{"path": {p}} }

func (g guest) call(ctx context.Context, method, rest string, q url.Values, in, out any) error {
	return g.c.call(ctx, method, sandboxPath(g.id, rest), q, in, out)
}

func (g files) ListDir(ctx context.Context, path string) ([]guestproto.FileInfo, error) {
	var out struct {
		Entries []guestproto.FileInfo `json:"entries"`
	}
	err := g.call(ctx, http.MethodGet, "/files/list", pathQuery(path), nil, &out)
	return out.Entries, err
}

func (g files) Stat(ctx context.Context, path string) (guestproto.FileInfo, error) {
	var fi guestproto.FileInfo
	err := g.call(ctx, http.MethodGet, "/files/stat", pathQuery(path), nil, &fi)
	return fi, err
}

func (g files) Mkdir(ctx context.Context, path string) error {
	return g.call(ctx, http.MethodPost, "/files/mkdir", nil, hostwire.PathRequest{Path: path}, nil)
}

func (g files) Remove(ctx context.Context, path string, recursive bool) error {
	q := pathQuery(path)
	q.Set("recursive", strconv.FormatBool(recursive))
	return g.call(ctx, http.MethodDelete, "/files", q, nil, nil)
}

func (g files) Rename(ctx context.Context, oldpath, newpath string) error {
	return g.call(ctx, http.MethodPost, "/files/rename", nil, hostwire.RenameRequest{From: oldpath, To: newpath}, nil)
}

// ReadFile streams a file down. Close the reader (before EOF it aborts the
// transfer).
func (g files) ReadFile(ctx context.Context, path string) (io.ReadCloser, guestproto.FileInfo, error) {
	req, err := g.c.request(ctx, http.MethodGet, g.base+"/files", pathQuery(path), nil)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	res, err := g.c.do(req)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	br := bufio.NewReader(res.Body)
	var fi guestproto.FileInfo
	if err := hostwire.ReadJSONLine(br, &fi); err != nil {
		res.Body.Close()
		return nil, guestproto.FileInfo{}, g.c.transportError(ctx, fmt.Errorf("read %s: file info: %w", path, err))
	}
	return &fileReader{c: g.c, ctx: ctx, res: res, r: br}, fi, nil
}

// fileReader is a download; at its end it reports the error the agent
// sent in the trailer, if any, instead of EOF.
type fileReader struct {
	c   *Client
	ctx context.Context
	res *http.Response
	r   io.Reader
}

func (f *fileReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	switch {
	case err == io.EOF: // the end itself, not an error wrapping EOF
		if terr := hostwire.TrailerError(f.res); terr != nil {
			return n, terr
		}
	case err != nil:
		err = f.c.transportError(f.ctx, err)
	}
	return n, err
}

func (f *fileReader) Close() error { return f.res.Body.Close() }

// WriteFile streams r up into path.
func (g files) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	q := pathQuery(path)
	q.Set("mode", strconv.FormatUint(uint64(mode), 10))
	src := &hostwire.SourceReader{R: r}
	// Not a bytes.Reader or the like: always streamed (chunked).
	req, err := g.c.request(ctx, http.MethodPut, g.base+"/files", q, io.MultiReader(src))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := g.c.do(req)
	if src.Err != nil {
		if res != nil {
			res.Body.Close()
		}
		return 0, fmt.Errorf("write %s: read source: %w", path, src.Err)
	}
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var out hostwire.WriteReply
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return 0, g.c.transportError(ctx, fmt.Errorf("write %s: %w", path, err))
	}
	return out.Written, nil
}

// pipeBody is an exec request body: the request line, then stdin. Closing
// it (the transport does when the request ends) fails further stdin
// writes instead of blocking them.
type pipeBody struct {
	io.Reader
	pr *io.PipeReader
}

func (b pipeBody) Close() error { return b.pr.Close() }

// StartExec starts a process; see hostwire's package documentation for the
// stream. Cancelling ctx kills it.
func (g guest) StartExec(ctx context.Context, req guestproto.ExecRequest) (host.Process, error) {
	line, err := hostwire.EncodeLine(req)
	if err != nil {
		return nil, err
	}
	if len(line) > hostwire.MaxLine {
		// The same class as the guest's own limit, which is lower.
		return nil, guestproto.Errorf(guestproto.CodeInvalid, "exec request of %d bytes exceeds the host API's %d", len(line), hostwire.MaxLine)
	}
	var body io.Reader = bytes.NewReader(line)
	p := &process{done: make(chan struct{})}
	if req.Stdin {
		pr, pw := io.Pipe()
		p.stdinR, p.stdin = pr, pw
		body = pipeBody{Reader: io.MultiReader(bytes.NewReader(line), pr), pr: pr}
	} else {
		p.stdin = closedStdin{}
	}
	hreq, err := g.c.request(ctx, http.MethodPost, sandboxPath(g.id, "/exec"), nil, body)
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/x-panda-exec")
	res, err := g.c.do(hreq)
	if err != nil {
		p.closeStdin(guestproto.ErrStreamDone)
		return nil, err
	}
	typ, payload, err := hostwire.ReadFrame(res.Body, nil)
	if err != nil || typ != hostwire.FrameStart {
		res.Body.Close()
		p.closeStdin(guestproto.ErrStreamDone)
		if err == nil {
			err = fmt.Errorf("exec stream began with frame %q", typ)
		}
		return nil, g.c.transportError(ctx, err)
	}
	var st hostwire.StartFrame
	json.Unmarshal(payload, &st)
	p.pid = st.PID
	var stdoutW, stderrW *io.PipeWriter
	p.stdout, stdoutW = io.Pipe()
	p.stderr, stderrW = io.Pipe()
	go p.demux(g.c, ctx, res.Body, stdoutW, stderrW)
	return p, nil
}

type closedStdin struct{}

func (closedStdin) Write([]byte) (int, error) {
	return 0, fmt.Errorf("exec: %w: the request did not ask for stdin", guestproto.ErrStreamDone)
}
func (closedStdin) Close() error { return nil }

// process is a remote exec.
type process struct {
	pid            int
	stdin          io.WriteCloser
	stdinR         *io.PipeReader // nil without stdin
	stdout, stderr *io.PipeReader

	done chan struct{}
	res  guestproto.ExecResult
	err  error
	once sync.Once
}

func (p *process) PID() int              { return p.pid }
func (p *process) Stdin() io.WriteCloser { return p.stdin }
func (p *process) Stdout() io.Reader     { return p.stdout }
func (p *process) Stderr() io.Reader     { return p.stderr }
func (p *process) closeStdin(err error) {
	if p.stdinR != nil {
		p.stdinR.CloseWithError(err)
	}
}

// Wait waits for the exit frame.
func (p *process) Wait() (guestproto.ExecResult, error) {
	<-p.done
	return p.res, p.err
}

// demux reads the response until the exit or error frame.
func (p *process) demux(c *Client, ctx context.Context, body io.ReadCloser, stdout, stderr *io.PipeWriter) {
	defer close(p.done)
	// Readers see EOF after a clean exit, the error otherwise; stdin
	// writes after the end fail as they do locally.
	p.err = demuxFrames(c, ctx, "exec", body, stdout, stderr, hostwire.FrameExit, func(payload []byte) error {
		if err := json.Unmarshal(payload, &p.res); err != nil {
			return fmt.Errorf("decode exit: %w", err)
		}
		return nil
	})
	p.closeStdin(guestproto.ErrStreamDone)
}
