package guest

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// watchQueue bounds the events waiting for the host: beyond it they are
// dropped and an overflow event follows the queued ones.
const watchQueue = 1024

// movePairWait is how long a rename's first half waits for its second.
const movePairWait = 50 * time.Millisecond

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// watchDir streams the changes under a directory with inotify.
//
// Protocol: REPLY {} once the watches are in place (or REPLY {error}:
// not_found, not_dir, too_large for a tree of more than
// guestproto.MaxWatches directories); then DATA, one JSON WatchEvent per
// line, until the host resets the stream, the agent stops, or the watched
// directory is removed (then CLOSE).
func (s *Server) watchDir(ctx context.Context, st *guestproto.Stream, req *guestproto.OpenRequest) {
	w, err := newWatcher(req.Path, req.Recursive, guestproto.MaxWatches)
	if err != nil {
		replyErr(st, err)
		return
	}
	defer w.close()
	if err := st.Reply(guestproto.Reply{}); err != nil {
		return
	}
	st.DiscardInput()
	q := make(chan guestproto.WatchEvent, watchQueue)
	go w.run(q)
	write := func(ev guestproto.WatchEvent) bool {
		b, _ := json.Marshal(ev)
		_, err := st.Write(append(b, '\n'))
		return err == nil
	}
	for {
		select {
		case ev, ok := <-q:
			if !ok {
				return // the directory is gone, or inotify failed
			}
			if !write(ev) {
				return
			}
			if len(q) == 0 && w.overflow.Swap(false) {
				if !write(guestproto.WatchEvent{Type: guestproto.WatchOverflow}) {
					return
				}
			}
		case <-st.Done():
			return
		case <-ctx.Done():
			return
		}
	}
}

// watcher is one inotify instance and its watch descriptors. run owns
// dirs; close may be called from another goroutine (it ends run).
type watcher struct {
	f         *os.File
	fd        int
	root      string
	recursive bool
	max       int
	dirs      map[int]string // watch descriptor -> directory
	overflow  atomic.Bool    // events were dropped
}

func newWatcher(path string, recursive bool, max int) (*watcher, error) {
	root, err := checkPath(path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, guestproto.Errorf(guestproto.CodeNotDir, "%s is not a directory", root)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	// Non-blocking: os.File reads through the runtime poller, and Close
	// wakes a blocked Read.
	w := &watcher{f: os.NewFile(uintptr(fd), "inotify"), fd: fd, root: root, recursive: recursive, max: max, dirs: map[int]string{}}
	if err := w.add(root); err != nil {
		w.close()
		return nil, err
	}
	if recursive {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || p == root {
				return nil // unreadable or removed meanwhile: skipped
			}
			return w.add(p)
		})
		if err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

func (w *watcher) add(dir string) error {
	if len(w.dirs) >= w.max {
		return guestproto.Errorf(guestproto.CodeTooLarge, "%s has more than %d directories to watch; watch a subdirectory", w.root, w.max)
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, watchMask)
	if err != nil {
		return err
	}
	w.dirs[wd] = dir
	return nil
}

func (w *watcher) close() { _ = w.f.Close() }

// run reads inotify events into q until the inotify file is closed or the
// root directory is removed; then it closes q.
func (w *watcher) run(q chan<- guestproto.WatchEvent) {
	defer close(q)
	send := func(ev guestproto.WatchEvent) {
		select {
		case q <- ev:
		default:
			w.overflow.Store(true)
		}
	}
	buf := make([]byte, 64<<10)
	// A move within the tree is MOVED_FROM then MOVED_TO with the same
	// cookie, next to each other but maybe in two reads; unpaired halves
	// are a remove (moved out) or a create (moved in). A MOVED_FROM at the
	// end of a read waits up to movePairWait for its MOVED_TO.
	var from *guestproto.WatchEvent
	var fromCookie uint32
	flushFrom := func() {
		if from != nil {
			send(*from)
			from = nil
		}
	}
	for {
		if from != nil {
			_ = w.f.SetReadDeadline(time.Now().Add(movePairWait))
		} else {
			_ = w.f.SetReadDeadline(time.Time{})
		}
		n, err := w.f.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			flushFrom()
			continue
		}
		if err != nil {
			return
		}
		var last guestproto.WatchEvent
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			raw := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if raw.Len > 0 {
				b := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(raw.Len)]
				for i, c := range b {
					if c == 0 {
						b = b[:i]
						break
					}
				}
				name = string(b)
			}
			off += unix.SizeofInotifyEvent + int(raw.Len)
			mask := raw.Mask
			if mask&unix.IN_Q_OVERFLOW != 0 {
				flushFrom()
				send(guestproto.WatchEvent{Type: guestproto.WatchOverflow})
				continue
			}
			dir, ok := w.dirs[int(raw.Wd)]
			if mask&unix.IN_IGNORED != 0 {
				delete(w.dirs, int(raw.Wd))
				continue
			}
			if !ok {
				continue
			}
			p := dir
			if name != "" {
				p = filepath.Join(dir, name)
			}
			isDir := mask&unix.IN_ISDIR != 0
			var ev guestproto.WatchEvent
			switch {
			case mask&unix.IN_DELETE_SELF != 0:
				if dir == w.root {
					flushFrom()
					send(guestproto.WatchEvent{Type: guestproto.WatchRemove, Path: w.root, IsDir: true})
					return
				}
				continue // its parent reports the remove
			case mask&unix.IN_MOVED_FROM != 0:
				flushFrom()
				from = &guestproto.WatchEvent{Type: guestproto.WatchRemove, Path: p, IsDir: isDir}
				fromCookie = raw.Cookie
				continue
			case mask&unix.IN_MOVED_TO != 0:
				if from != nil && fromCookie == raw.Cookie {
					ev = guestproto.WatchEvent{Type: guestproto.WatchRename, Path: p, OldPath: from.Path, IsDir: isDir}
					from = nil
				} else {
					flushFrom()
					ev = guestproto.WatchEvent{Type: guestproto.WatchCreate, Path: p, IsDir: isDir}
				}
				if isDir && w.recursive {
					w.addTree(p, send)
				}
			case mask&unix.IN_CREATE != 0:
				ev = guestproto.WatchEvent{Type: guestproto.WatchCreate, Path: p, IsDir: isDir}
				if isDir && w.recursive {
					w.addTree(p, send)
				}
			case mask&unix.IN_MODIFY != 0:
				ev = guestproto.WatchEvent{Type: guestproto.WatchWrite, Path: p, IsDir: isDir}
			case mask&unix.IN_DELETE != 0:
				ev = guestproto.WatchEvent{Type: guestproto.WatchRemove, Path: p, IsDir: isDir}
			case mask&unix.IN_ATTRIB != 0:
				ev = guestproto.WatchEvent{Type: guestproto.WatchChmod, Path: p, IsDir: isDir}
			default:
				continue
			}
			flushFrom()
			// Many writes in a row to one file are one event.
			if ev.Type == guestproto.WatchWrite && last == ev {
				continue
			}
			last = ev
			send(ev)
		}
	}
}

// addTree watches a directory created (or moved) into a recursive watch,
// and the directories already in it. Beyond the bound an overflow event
// says that changes there are not seen.
func (w *watcher) addTree(dir string, send func(guestproto.WatchEvent)) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if err := w.add(p); err != nil {
			send(guestproto.WatchEvent{Type: guestproto.WatchOverflow})
			return filepath.SkipAll
		}
		return nil
	})
}
