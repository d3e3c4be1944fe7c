// Package objstore owns the blob store that artifacts (templates,
// snapshots, paused sandboxes) are kept in: a flat namespace of keys
// holding immutable byte strings, served by a local directory on one host
// (the default) or by any S3-compatible server for a fleet. Store is the
// contract; Dir and S3 implement it, Open picks one from a URL, and one
// conformance suite (objstore_test.go) runs against both.
//
// Keys are slash-separated paths ("chunks/ab12…", "manifests/x.json"):
// non-empty components, none starting with '.', no leading or trailing
// slash, no NUL or backslash, at most 512 bytes. The same rule holds for
// every backend, so a key that works on one host's directory works on S3
// and no key can name a file outside a Dir's root.
//
// Errors are classified once, here: ErrNotFound (the key does not exist),
// ErrUnavailable (the store cannot be reached or answered with a server
// error: network errors, timeouts, 5xx — a caller answers 503 and may
// retry), ErrInvalidKey and ErrInvalidRange (the caller's mistake). Every
// other error is unexpected. All are wrapped with what was being done and
// tested with errors.Is.
package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// Errors (see the package doc), each of a class of
// internal/contract/errs.
var (
	ErrNotFound     = errs.New(errs.NotFound, "object not found")
	ErrUnavailable  = errs.New(errs.Unavailable, "object store unavailable")
	ErrInvalidKey   = errs.New(errs.Invalid, "invalid object key")
	ErrInvalidRange = errs.New(errs.Invalid, "invalid range")
	// ErrExists: Create found the key taken.
	ErrExists = errs.New(errs.Conflict, "object exists")
)

// Info describes one stored object.
type Info struct {
	Key     string
	Size    int64
	ModTime time.Time // when it was last written, by the store's clock
}

// Store is a blob store.
//
// Contract, for every implementation:
//   - Safe for concurrent use by many goroutines and by many processes
//     (hosts) sharing the same store.
//   - Put is atomic: a reader sees either no object, the previous one or
//     the complete new one, never a prefix; when Put returns nil the object
//     is durable (survives a crash of the store's host). Put reads exactly
//     size bytes from r; a reader that yields fewer or more is an error and
//     stores nothing. Putting an existing key replaces it.
//   - Get and GetRange return ErrNotFound for a missing key. GetRange
//     returns the n bytes at off (n > 0), fewer only when the object ends
//     first; off at or past the end is ErrInvalidRange.
//   - Stat returns ErrNotFound for a missing key.
//   - Delete of a missing key succeeds (deleting is idempotent).
//   - List yields every object whose key starts with prefix (a plain string
//     prefix, "" for all), in lexical order of keys. Objects put or deleted
//     during the listing may or may not appear. An error ends the sequence.
//   - Errors are classified as the package doc says.
type Store interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (Info, error)
	Delete(ctx context.Context, key string) error
	List(ctx context.Context, prefix string) iter.Seq2[Info, error]
	// String names the store for logs and messages (no credentials).
	String() string
}

// Creator is a Store that can put an object only where there is none, in
// one step: of hosts creating the same key at once, one succeeds and the
// others get ErrExists. Dir and S3 are Creators. (An S3-compatible server
// that ignores a conditional PUT's If-None-Match replaces the object
// instead, as Put does: callers must still work then, only with a wider
// window for a race.)
type Creator interface {
	// Create is Put of an object of at most MaxCreate bytes that stores
	// nothing and returns an error wrapping ErrExists if key exists.
	Create(ctx context.Context, key string, r io.Reader, size int64) error
}

// MaxCreate bounds the size of an object put with Create (one request on
// S3: conditional multipart uploads are not asked of every server).
const MaxCreate = 64 << 20

// Exists reports whether key exists in s; only errors other than
// ErrNotFound are returned.
func Exists(ctx context.Context, s Store, key string) (bool, error) {
	_, err := s.Stat(ctx, key)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, ErrNotFound):
		return false, nil
	default:
		return false, err
	}
}

// maxKeyLen keeps keys well inside S3's 1024-byte limit and a file
// system's 4096-byte path limit once a root or prefix is added.
const maxKeyLen = 512

// ValidKey returns nil when key follows the rule in the package doc, or an
// error wrapping ErrInvalidKey that says why not.
func ValidKey(key string) error {
	if err := validPath(key); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, err)
	}
	return nil
}

func validPath(key string) error {
	switch {
	case key == "":
		return errors.New("empty")
	case len(key) > maxKeyLen:
		return fmt.Errorf("longer than %d bytes", maxKeyLen)
	case strings.ContainsAny(key, "\x00\\"):
		return errors.New("contains NUL or backslash")
	case strings.HasPrefix(key, "/"):
		return errors.New("absolute")
	}
	for c := range strings.SplitSeq(key, "/") {
		switch {
		case c == "":
			return errors.New("empty path component (double or trailing slash)")
		case c == "." || c == "..":
			return fmt.Errorf("path component %q", c)
		case c[0] == '.':
			return fmt.Errorf("path component %q starts with a dot", c)
		}
	}
	return nil
}

// validPrefix checks a List prefix: any leading part of a valid key.
func validPrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	// "a/b/" and "a/b/c" (a partial last component) are prefixes of the
	// valid key "a/b/cx" or "a/b/x"; "a/../" is a prefix of none.
	if err := validPath(prefix + "x"); err != nil {
		return fmt.Errorf("%w: prefix %q: %s", ErrInvalidKey, prefix, err)
	}
	return nil
}

// errSeq is a List result that yields one error.
func errSeq(err error) iter.Seq2[Info, error] {
	return func(yield func(Info, error) bool) { yield(Info{}, err) }
}
