package guestproto

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// Stat describes path (lstat: a symlink is described, not followed).
func (c *Client) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	r, err := c.call(ctx, &OpenRequest{Op: OpStat, Path: path})
	if err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, err)
	}
	if r.Info == nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", path, Errorf(CodeInternal, "reply without info"))
	}
	return *r.Info, nil
}

// Mkdir creates path and any missing parents (mkdir -p); an existing
// directory is not an error.
func (c *Client) Mkdir(ctx context.Context, path string) error {
	if err := ValidPath(path); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpMkdir, Path: path}); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	return nil
}

// Remove removes path; a non-empty directory only if recursive (otherwise
// ErrNotEmpty). A missing path is ErrNotFound.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	if err := ValidPath(path); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpRemove, Path: path, Recursive: recursive}); err != nil {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// Rename renames oldpath to newpath (rename(2): replaces a file at newpath).
func (c *Client) Rename(ctx context.Context, oldpath, newpath string) error {
	for _, p := range []string{oldpath, newpath} {
		if err := ValidPath(p); err != nil {
			return fmt.Errorf("rename %s: %w", oldpath, err)
		}
	}
	if _, err := c.call(ctx, &OpenRequest{Op: OpRename, Path: oldpath, NewPath: newpath}); err != nil {
		return fmt.Errorf("rename %s: %w", oldpath, err)
	}
	return nil
}

// ListDir lists the directory path, sorted by name, in at most CallTimeout.
// A directory of more than MaxListEntries entries, or whose listing takes
// more than MaxListBytes of JSON, is not listed: the error is a *Error of
// CodeTooLarge whose message says so (list a subdirectory instead).
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpListDir, Path: path}, 1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	defer s.detach()
	if err := s.CloseWrite(); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	out, err := decodeListing(s, path, c.cfg.MaxListEntries, c.cfg.MaxListBytes)
	if err != nil {
		s.abort(err, &Error{Code: CodeCanceled, Message: "list aborted by host"})
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	return out, nil
}

// decodeListing reads a listing (one JSON FileInfo per line) of dir from r
// until EOF, holding at most maxEntries entries, maxBytes bytes of JSON and
// one line of maxListLine bytes. Over a limit it fails with CodeTooLarge,
// and on a malformed line with CodeInternal; a read error is returned as is.
func decodeListing(r io.Reader, dir string, maxEntries, maxBytes int) ([]FileInfo, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), maxListLine)
	var out []FileInfo
	total := 0
	for sc.Scan() {
		line := sc.Bytes()
		total += len(line) + 1
		switch {
		case len(out) == maxEntries:
			return nil, Errorf(CodeTooLarge, "directory %s has more than %d entries; list a subdirectory", dir, maxEntries)
		case total > maxBytes:
			return nil, Errorf(CodeTooLarge, "the listing of directory %s exceeds %d bytes; list a subdirectory", dir, maxBytes)
		}
		var fi FileInfo
		if err := json.Unmarshal(line, &fi); err != nil {
			return nil, Errorf(CodeInternal, "malformed entry %d of the listing: %v", len(out)+1, err)
		}
		out = append(out, fi)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, Errorf(CodeTooLarge, "an entry of the listing of directory %s exceeds %d bytes", dir, maxListLine)
		}
		return nil, err
	}
	return out, nil
}

// ReadFile opens path for streaming download. ctx governs the whole read;
// Close the reader (before EOF it aborts the transfer).
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, FileInfo, error) {
	if err := ValidPath(path); err != nil {
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpReadFile, Path: path}, 1)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	if err := s.CloseWrite(); err != nil {
		s.abort(err, nil)
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	r, err := c.waitFrame(s, s.reply, "REPLY")
	if err != nil {
		s.detach()
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, err)
	}
	if r.Info == nil {
		s.Reset(&Error{Code: CodeCanceled})
		return nil, FileInfo{}, fmt.Errorf("read %s: %w", path, Errorf(CodeInternal, "reply without info"))
	}
	s.setDeadline(0, nil) // the transfer is bounded by ctx
	return &fileReader{s: s}, *r.Info, nil
}

type fileReader struct {
	s   *Stream
	eof bool
}

func (r *fileReader) Read(p []byte) (int, error) {
	n, err := r.s.Read(p)
	if errors.Is(err, io.EOF) {
		r.eof = true
	}
	return n, err
}

func (r *fileReader) Close() error {
	if !r.eof {
		r.s.abort(ErrClosed, &Error{Code: CodeCanceled, Message: "download closed by host"})
	}
	r.s.detach()
	return nil
}

// WriteFile stores what r yields at path, streamed: the guest writes to a
// temporary file in the same directory (creating missing parents) and renames
// it into place at the end, so a failed upload leaves no partial file. mode's
// permission bits apply (0 means 0644). It returns the bytes stored. The
// transfer is bounded by ctx; the guest's answers before and after it by
// CallTimeout.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := ValidPath(path); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	s, err := c.open(ctx, &OpenRequest{Op: OpWriteFile, Path: path, Mode: unixMode(mode)}, 0)
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	defer s.detach()
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	s.setDeadline(0, nil)
	bp := payloadPool.Get().(*[]byte)
	defer payloadPool.Put(bp)
	buf := *bp
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := s.Write(buf[:n]); err != nil {
				if errors.Is(err, ErrStreamDone) {
					// The guest gave up early; its EXIT says why.
					s.setDeadline(c.cfg.CallTimeout, c.slowGuest(OpWriteFile))
					if _, xerr := c.waitFrame(s, s.exit, "EXIT"); xerr != nil {
						err = xerr
					}
				}
				return 0, fmt.Errorf("write %s: %w", path, err)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			s.Reset(&Error{Code: CodeCanceled, Message: "upload source failed"})
			return 0, fmt.Errorf("write %s: read source: %w", path, rerr)
		}
	}
	if err := s.CloseWrite(); err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	s.setDeadline(c.cfg.CallTimeout, c.slowGuest(OpWriteFile))
	res, err := c.waitFrame(s, s.exit, "EXIT")
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	return res.Written, nil
}

// unixMode converts the permission bits of an fs.FileMode to st_mode bits.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		u |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		u |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		u |= 0o1000
	}
	return u
}
