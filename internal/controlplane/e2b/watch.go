package e2b

import (
	"context"
	"errors"
	"io"
	"path"

	"connectrpc.com/connect"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// watchDir is WatchDir: a start event once the guest's watches are in
// place, then the changes as envd (fsnotify) names them, with keepalives,
// until the client goes away, Connect-Timeout-Ms passes or the directory
// is removed.
func (s *Server) watchDir(ctx context.Context, req *connect.Request[watchDirRequest], stream *connect.ServerStream[watchDirResponse]) error {
	t, err := s.target(ctx, req.Header(), "")
	if err != nil {
		return s.rpcError(err)
	}
	dw, ok := t.g.(host.DirWatcher)
	if !ok {
		return connect.NewError(connect.CodeUnimplemented, errors.New("/filesystem.Filesystem/WatchDir is not served for this sandbox: its host cannot watch directories"))
	}
	root, err := t.resolve(req.Msg.Path)
	if err != nil {
		return s.rpcError(err)
	}
	w, err := dw.WatchDir(ctx, root, req.Msg.Recursive)
	if err != nil {
		return s.rpcError(err)
	}
	defer w.Close()
	send := lockedSend(func(r watchDirResponse) error { return stream.Send(&r) })
	if err := send(watchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	stop := keepalive(func() { send(watchDirResponse{Keepalive: &struct{}{}}) })
	defer stop()
	for {
		ev, err := w.Next()
		if errors.Is(err, io.EOF) {
			return nil // the directory is gone: so is the watch
		}
		if err != nil {
			if ctx.Err() != nil {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the watch timed out"))
				}
				return connect.NewError(connect.CodeCanceled, errors.New("the watch was canceled"))
			}
			return s.rpcError(err)
		}
		if ev.Type == guestproto.WatchOverflow {
			s.log.Debug("watch overflow: events lost", "sandbox_id", t.id, "path", root)
		}
		for _, fe := range watchEvents(root, ev) {
			if err := send(watchDirResponse{Filesystem: &fe}); err != nil {
				return err
			}
		}
	}
}

// watchEvents is what envd sends for a guest's event under root: names
// relative to root, and a rename as fsnotify reports it on Linux (RENAME
// of the old name, then CREATE of the new). An overflow has no E2B
// counterpart and is dropped.
func watchEvents(root string, ev guestproto.WatchEvent) []filesystemEvent {
	rel := func(p string) string {
		if p == root {
			return "."
		}
		if r, ok := cutDir(root, p); ok {
			return r
		}
		return p
	}
	switch ev.Type {
	case guestproto.WatchCreate:
		return []filesystemEvent{{Name: rel(ev.Path), Type: eventCreate}}
	case guestproto.WatchWrite:
		return []filesystemEvent{{Name: rel(ev.Path), Type: eventWrite}}
	case guestproto.WatchRemove:
		return []filesystemEvent{{Name: rel(ev.Path), Type: eventRemove}}
	case guestproto.WatchChmod:
		return []filesystemEvent{{Name: rel(ev.Path), Type: eventChmod}}
	case guestproto.WatchRename:
		if ev.OldPath == "" {
			return []filesystemEvent{{Name: rel(ev.Path), Type: eventCreate}}
		}
		return []filesystemEvent{{Name: rel(ev.OldPath), Type: eventRename}, {Name: rel(ev.Path), Type: eventCreate}}
	}
	return nil
}

// cutDir is p relative to dir, if p is under dir.
func cutDir(dir, p string) (string, bool) {
	dir, p = path.Clean(dir), path.Clean(p)
	if dir == "/" {
		return p[1:], p != "/"
	}
	r, ok := p, len(p) > len(dir) && p[:len(dir)] == dir && p[len(dir)] == '/'
	if !ok {
		return "", false
	}
	return r[len(dir)+1:], true
}
