package pandastack

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// ContextStats counts what a build context sent holds so far.
type ContextStats struct {
	Files int   // entries written: files, directories, symlinks
	Bytes int64 // bytes of the files' contents
}

// WriteContextTar writes the build context dir to w as a gzip-compressed
// tar archive, leaving out what dir's .dockerignore excludes, with the
// rules of Docker's CLI (github.com/moby/patternmatcher: "#" comments,
// "**", "!" exceptions, the last matching line wins). Symbolic links are
// stored as links, never followed; devices, sockets and pipes are left
// out. Names are relative to dir, with "/" separators. progress, if not
// nil, is called after each entry. It returns what it wrote.
func WriteContextTar(w io.Writer, dir string, progress func(ContextStats)) (ContextStats, error) {
	var st ContextStats
	if err := checkContextDir(dir); err != nil {
		return st, err
	}
	pm, err := readDockerignore(dir)
	if err != nil {
		return st, err
	}
	zw := gzip.NewWriter(w)
	tw := tar.NewWriter(zw)
	// The parent directories' match results, as Docker's archive package
	// keeps them, so that "!" exceptions under an excluded directory work.
	parents := map[string]patternmatcher.MatchInfo{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("read build context: %w", err)
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if pm != nil {
			parent := parents[pathDir(rel)]
			skip, info, err := pm.MatchesUsingParentResults(rel, parent)
			if err != nil {
				return fmt.Errorf(".dockerignore: %w", err)
			}
			if d.IsDir() {
				parents[rel] = info
			}
			if skip {
				// An excluded directory is still walked when exceptions
				// may take back something under it.
				if d.IsDir() && !mayReinclude(pm, rel) {
					return filepath.SkipDir
				}
				return nil
			}
		}
		return addContextEntry(tw, p, rel, d, &st, progress)
	})
	if err != nil {
		return st, err
	}
	if err := tw.Close(); err != nil {
		return st, fmt.Errorf("write build context: %w", err)
	}
	if err := zw.Close(); err != nil {
		return st, fmt.Errorf("write build context: %w", err)
	}
	return st, nil
}

func checkContextDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("build context %s is not a directory", dir)
	}
	return nil
}

func pathDir(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[:i]
	}
	return ""
}

// readDockerignore reads dir/.dockerignore; nil if there is none.
func readDockerignore(dir string) (*patternmatcher.PatternMatcher, error) {
	f, err := os.Open(filepath.Join(dir, ".dockerignore"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read .dockerignore: %w", err)
	}
	if len(patterns) == 0 {
		return nil, nil
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return nil, fmt.Errorf(".dockerignore: %w", err)
	}
	return pm, nil
}

// mayReinclude reports whether an exception of pm may take back a path
// under the excluded directory rel (as Docker's archive package decides
// whether to walk it).
func mayReinclude(pm *patternmatcher.PatternMatcher, rel string) bool {
	if !pm.Exclusions() {
		return false
	}
	dirSlash := rel + "/"
	for _, pat := range pm.Patterns() {
		if !pat.Exclusion() {
			continue
		}
		if strings.HasPrefix(pat.String()+"/", dirSlash) {
			return true
		}
	}
	return false
}

func addContextEntry(tw *tar.Writer, p, rel string, d fs.DirEntry, st *ContextStats, progress func(ContextStats)) error {
	fi, err := d.Info()
	if err != nil {
		return fmt.Errorf("read build context: %w", err)
	}
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		if link, err = os.Readlink(p); err != nil {
			return fmt.Errorf("read build context: %w", err)
		}
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return nil // devices, sockets, pipes: nothing a build copies
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("build context %s: %w", rel, err)
	}
	h.Name = rel
	if fi.IsDir() {
		h.Name += "/"
	}
	// Who owns the files here says nothing about the image.
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	h.Format = tar.FormatPAX
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("write build context: %w", err)
	}
	if fi.Mode().IsRegular() {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("read build context: %w", err)
		}
		n, err := io.Copy(tw, f)
		f.Close()
		st.Bytes += n
		if err != nil {
			return fmt.Errorf("write build context %s: %w", rel, err)
		}
	}
	st.Files++
	if progress != nil {
		progress(*st)
	}
	return nil
}
