package guestproto

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
)

// OpWatchDir streams the changes in a directory (see Client.WatchDir).
const OpWatchDir Op = "watch_dir"

// FeatureWatchDir: the agent serves OpWatchDir.
const FeatureWatchDir = "watch_dir"

// MaxWatches bounds the directories one recursive watch covers: a tree
// with more fails with CodeTooLarge; directories created later beyond it
// are not watched, and an overflow event says so.
const MaxWatches = 8192

// Watch event types.
const (
	WatchCreate   = "create"   // a file or directory appeared (or was moved in)
	WatchWrite    = "write"    // a file's content changed
	WatchRemove   = "remove"   // removed (or moved out)
	WatchRename   = "rename"   // moved within the watched tree: Path is the new name, OldPath the old
	WatchChmod    = "chmod"    // metadata changed (mode, owner, times)
	WatchOverflow = "overflow" // events were lost (a queue was full); Path is empty
)

// WatchEvent is one change in a watched directory: one JSON object per
// line in the watch_dir stream's DATA.
type WatchEvent struct {
	Type    string `json:"type"`
	Path    string `json:"path,omitempty"`
	OldPath string `json:"old_path,omitempty"`
	IsDir   bool   `json:"is_dir,omitempty"`
}

// maxWatchLine bounds one event line (two paths of at most 4096 bytes).
const maxWatchLine = 16 << 10

// WatchDir starts watching the directory path (and, if recursive, the
// directories under it) and returns once the guest's watches are in place.
// Read the events in order with Next; Close ends the watch, and so does
// ctx. While nobody calls Next, events queue in the guest, which drops
// them beyond its bound and then sends a WatchOverflow event. An agent
// without FeatureWatchDir fails with CodeInvalid; a missing directory with
// CodeNotFound, a file with CodeNotDir, a tree of more than MaxWatches
// directories with CodeTooLarge.
func (c *Client) WatchDir(ctx context.Context, path string, recursive bool) (*DirWatch, error) {
	if err := ValidPath(path); err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if c.established.Load() && !c.watchDir.Load() {
		return nil, fmt.Errorf("watch %s: %w", path, Errorf(CodeInvalid, "the guest agent cannot watch directories (it predates watch_dir; rebuild the template)"))
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpWatchDir, Path: path, Recursive: recursive}, 1)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.abort(err, nil)
		s.detach()
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		s.detach()
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	s.setDeadline(0, nil) // the watch is bounded by ctx
	sc := bufio.NewScanner(s)
	sc.Buffer(make([]byte, 0, 4<<10), maxWatchLine)
	return &DirWatch{s: s, sc: sc, path: path}, nil
}

// DirWatch is a running watch (see Client.WatchDir). Next is for one
// goroutine; Close may be called from any, more than once.
type DirWatch struct {
	s    *Stream
	sc   *bufio.Scanner
	path string
	once sync.Once
	// next and close replace s and sc in a DirWatch made by NewDirWatch.
	next  func() (WatchEvent, error)
	close func() error
}

// NewDirWatch returns a DirWatch carried by something other than a guest
// connection (the host API): next and close implement Next and Close with
// their contracts (close is called once).
func NewDirWatch(next func() (WatchEvent, error), close func() error) *DirWatch {
	return &DirWatch{next: next, close: close}
}

// Next returns the next event. It returns io.EOF when the guest ended the
// watch (the directory was removed), the stream's error when the watch
// was closed, its ctx ended or the guest went away.
func (w *DirWatch) Next() (WatchEvent, error) {
	if w.next != nil {
		return w.next()
	}
	if !w.sc.Scan() {
		err := w.sc.Err()
		if err == nil {
			if err = w.s.Err(); err == nil {
				err = io.EOF
			}
		}
		return WatchEvent{}, err
	}
	var ev WatchEvent
	if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
		err = Errorf(CodeInternal, "watch %s: malformed event: %v", w.path, err)
		w.s.abort(err, &Error{Code: CodeCanceled, Message: "watch aborted by host"})
		return WatchEvent{}, err
	}
	return ev, nil
}

// Close ends the watch.
func (w *DirWatch) Close() error {
	w.once.Do(func() {
		if w.close != nil {
			w.close()
			return
		}
		w.s.abort(ErrClosed, &Error{Code: CodeCanceled, Message: "watch closed by host"})
		w.s.detach()
	})
	return nil
}
