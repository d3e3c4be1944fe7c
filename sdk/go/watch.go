package pandastack

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Watch event types (WatchEvent.Type).
const (
	WatchCreate   = "create"   // a file or directory appeared (or was moved in)
	WatchWrite    = "write"    // a file's content changed
	WatchRemove   = "remove"   // removed (or moved out)
	WatchRename   = "rename"   // moved within the watched tree: Path new, OldPath old
	WatchChmod    = "chmod"    // metadata changed (mode, owner, times)
	WatchOverflow = "overflow" // events were lost: the reader was too slow; no Path
)

// WatchEvent is one change in a watched directory.
type WatchEvent struct {
	Type    string `json:"type"`
	Path    string `json:"path,omitempty"`
	OldPath string `json:"old_path,omitempty"`
	IsDir   bool   `json:"is_dir,omitempty"`
}

// DirWatch is a running directory watch (StartWatchDir). Next is for one
// goroutine; Close may be called from any.
type DirWatch struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	path string
}

// StartWatchDir starts watching the directory p (and, if recursive, the
// directories under it, at most 8192 in all) and returns once the watch is
// in place. Read events with Next; Close (or ctx) ends the watch. Events
// that a slow reader does not take in time are dropped in the sandbox and
// an overflow event says so. Errors: ErrNotFound (no such directory or
// sandbox), ErrConflict (not running), ErrInvalid (not a directory, a tree
// of too many directories, a relative path).
func (s *Sandbox) StartWatchDir(ctx context.Context, p string, recursive bool) (*DirWatch, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return nil, err
	}
	q := pathQuery(p)
	q.Set("recursive", strconv.FormatBool(recursive))
	req, err := s.c.newRequest(ctx, http.MethodGet, path("sandboxes", s.ID, "watch"), q, nil, "")
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := s.c.send(req)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", p, err)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 4<<10), 64<<10)
	return &DirWatch{body: resp.Body, sc: sc, path: p}, nil
}

// Next returns the next event; io.EOF when the watch ended because the
// directory was removed, or the read's error (the context's after Close
// or when ctx ended).
func (w *DirWatch) Next() (WatchEvent, error) {
	if !w.sc.Scan() {
		err := w.sc.Err()
		if err == nil {
			err = io.EOF
		}
		return WatchEvent{}, err
	}
	var ev WatchEvent
	if err := json.Unmarshal(w.sc.Bytes(), &ev); err != nil {
		return WatchEvent{}, fmt.Errorf("watch %s: malformed event: %w", w.path, err)
	}
	return ev, nil
}

// Close ends the watch.
func (w *DirWatch) Close() error { return w.body.Close() }

// WatchDir watches the directory p (see StartWatchDir) and calls fn with
// each event, in order, until ctx ends (it returns nil then) or the
// directory is removed (nil too). fn runs on the caller's goroutine.
func (s *Sandbox) WatchDir(ctx context.Context, p string, recursive bool, fn func(WatchEvent)) error {
	w, err := s.StartWatchDir(ctx, p, recursive)
	if err != nil {
		return err
	}
	defer w.Close()
	for {
		ev, err := w.Next()
		switch {
		case errors.Is(err, io.EOF), err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("watch %s: %w", p, err)
		}
		fn(ev)
	}
}
