package guest

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

const fileChunk = guestproto.MaxPayload

// checkPath validates a request path and returns it cleaned.
func checkPath(p string) (string, error) {
	if err := guestproto.ValidPath(p); err != nil {
		return "", err
	}
	return filepath.Clean(p), nil
}

// toProtoError classifies err for the host. An *Error passes through.
func toProtoError(err error) *guestproto.Error {
	var pe *guestproto.Error
	if errors.As(err, &pe) {
		return pe
	}
	code := guestproto.CodeInternal
	var errno syscall.Errno
	if errors.As(err, &errno) {
		code = guestproto.ErrnoCode(errno)
	}
	return &guestproto.Error{Code: code, Message: err.Error()}
}

// fileInfo describes p from an lstat result.
func fileInfo(p string, fi fs.FileInfo) guestproto.FileInfo {
	info := guestproto.FileInfo{
		Name:          filepath.Base(p),
		Path:          p,
		Size:          fi.Size(),
		Mode:          uint32(fi.Mode().Perm()),
		IsDir:         fi.IsDir(),
		IsSymlink:     fi.Mode()&fs.ModeSymlink != 0,
		MtimeUnixNano: fi.ModTime().UnixNano(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
	}
	if info.IsSymlink {
		info.LinkTarget, _ = os.Readlink(p)
	}
	return info
}

// stat: REPLY {info} (lstat).
func (s *Server) stat(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		replyErr(st, err)
		return
	}
	info := fileInfo(p, fi)
	_ = st.Reply(guestproto.Reply{Info: &info})
}

// listDir: REPLY {}, then DATA carrying one JSON FileInfo per line, sorted by
// name, then CLOSE.
func (s *Server) listDir(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		replyErr(st, err)
		return
	}
	if err := st.Reply(guestproto.Reply{}); err != nil {
		return
	}
	bw := bufio.NewWriterSize(st, fileChunk)
	enc := json.NewEncoder(bw)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			continue // removed since ReadDir
		}
		if err := enc.Encode(fileInfo(filepath.Join(p, e.Name()), fi)); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

// mkdir: mkdir -p; REPLY {} or an error (exists if path is not a directory).
func (s *Server) mkdir(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		replyErr(st, guestproto.Errorf(guestproto.CodeExists, "%s exists and is not a directory", p))
		return
	}
	mode := fs.FileMode(req.Mode & 0o777)
	if mode == 0 {
		mode = 0o755
	}
	if err := os.MkdirAll(p, mode); err != nil {
		replyErr(st, err)
		return
	}
	_ = st.Reply(guestproto.Reply{})
}

// remove: REPLY {} or an error; not_empty for a non-empty directory unless
// recursive; not_found if nothing is there.
func (s *Server) remove(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	if p == "/" {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "refusing to remove /"))
		return
	}
	if _, err := os.Lstat(p); err != nil {
		replyErr(st, err)
		return
	}
	if req.Recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		replyErr(st, err)
		return
	}
	_ = st.Reply(guestproto.Reply{})
}

// rename: rename(2); REPLY {} or an error.
func (s *Server) rename(st *guestproto.Stream, req *guestproto.OpenRequest) {
	from, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	to, err := checkPath(req.NewPath)
	if err != nil {
		replyErr(st, err)
		return
	}
	if err := os.Rename(from, to); err != nil {
		replyErr(st, err)
		return
	}
	_ = st.Reply(guestproto.Reply{})
}

// readFile: REPLY {info}, then the file's bytes as DATA, then CLOSE. A read
// error midway RESETs the stream.
func (s *Server) readFile(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		replyErr(st, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		replyErr(st, err)
		return
	}
	if fi.IsDir() {
		replyErr(st, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", p))
		return
	}
	info := fileInfo(p, fi)
	if err := st.Reply(guestproto.Reply{Info: &info}); err != nil {
		return
	}
	buf := make([]byte, fileChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := st.Write(buf[:n]); werr != nil {
				return
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			st.Reset(toProtoError(err))
			return
		}
	}
}

// uploadError is err of an upload, without the name of the temporary
// file next to the target that the user never named (".panda-upload-…"):
// its errno alone, which toProtoError classifies; the host names the
// target ("write PATH: ...").
func uploadError(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return err
}

// writeFile: REPLY {} once a temporary file next to path is open (parents
// are created), then the host's DATA is written to it; at the host's CLOSE
// the file gets its mode and is renamed over path; EXIT {written} or EXIT
// {error}. If the stream is aborted the temporary file is removed.
func (s *Server) writeFile(st *guestproto.Stream, req *guestproto.OpenRequest) {
	p, err := checkPath(req.Path)
	if err != nil {
		replyErr(st, err)
		return
	}
	if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
		replyErr(st, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", p))
		return
	}
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		replyErr(st, err)
		return
	}
	f, err := os.CreateTemp(dir, ".panda-upload-*")
	if err != nil {
		replyErr(st, uploadError(err))
		return
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := st.Reply(guestproto.Reply{}); err != nil {
		return
	}
	buf := make([]byte, fileChunk)
	var written int64
	for {
		n, err := st.Read(buf)
		if n > 0 {
			if _, werr := f.Write(buf[:n]); werr != nil {
				_ = st.Exit(guestproto.Reply{Error: toProtoError(uploadError(werr))})
				return
			}
			written += int64(n)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return // aborted: nobody to tell
		}
	}
	mode := req.Mode & 0o7777
	if mode == 0 {
		mode = 0o644
	}
	err = syscall.Fchmod(int(f.Fd()), mode)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		_ = st.Exit(guestproto.Reply{Error: toProtoError(uploadError(err))})
		return
	}
	done = true
	_ = st.Exit(guestproto.Reply{Written: written})
}
