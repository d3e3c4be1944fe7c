// Package s3test runs a real S3-compatible server for tests: versitygw
// (package versitygw, its posix backend serving a temporary directory) as
// a child process on a free loopback port. `make s3-deps` builds the
// binary; a test that needs it fails, with the command that builds it,
// when it is missing — it never skips.
//
// The server is killed by its process ID when the test ends, whether it
// passed or not, and also if the test binary dies first (the parent-death
// signal).
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/pandastack/pandastack/internal/testing/versitygw"
)

// Version is the versitygw release the tests run; the Makefile's
// VERSITYGW_VERSION names the same one.
const Version = versitygw.Version

// Bucket is the bucket every Server starts with.
const Bucket = "panda-test"

// BuildHelp says how to build the binary.
const BuildHelp = versitygw.BuildHelp

// Binary returns the path of the versitygw binary: $PANDA_VERSITYGW (the
// Makefile sets it) or versitygw.DefaultBinary.
func Binary() (string, error) {
	if p := os.Getenv("PANDA_VERSITYGW"); p != "" {
		return p, nil
	}
	return versitygw.DefaultBinary()
}

// Server is one running versitygw.
type Server struct {
	Addr      string // 127.0.0.1:port
	Dir       string // the posix backend's root; the bucket is Dir/Bucket
	AccessKey string
	SecretKey string

	t   testing.TB
	srv *versitygw.Server
}

// Start runs a server with an empty bucket named Bucket; it is stopped
// when t ends. Under -short it skips the test (testkit.S3).
func Start(t testing.TB) *Server {
	t.Helper()
	testkit.S3(t)
	bin, err := Binary()
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	if err := versitygw.Check(bin); err != nil {
		t.Fatalf("s3test: %v", err)
	}
	tmp := t.TempDir()
	s := &Server{
		Addr:      freeAddr(t),
		Dir:       filepath.Join(tmp, "data"),
		AccessKey: "pandatest",
		SecretKey: "pandatest-secret",
		t:         t,
	}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.srv = versitygw.New(versitygw.Config{Binary: bin, Dir: s.Dir, Addr: s.Addr, AccessKey: s.AccessKey,
		SecretKey: s.SecretKey, LogFile: filepath.Join(tmp, "versitygw.log")})
	t.Cleanup(s.Stop)
	s.Restart()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.srv.MakeBucket(ctx, Bucket); err != nil {
		t.Fatalf("s3test: %v", err)
	}
	return s
}

func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Credentials sign requests to the server.
func (s *Server) Credentials() objstore.Credentials { return s.srv.Credentials() }

// URL is the store URL of prefix in the bucket. It asks for two tries per
// request, so a test of a server that is down does not wait out ten.
func (s *Server) URL(prefix string) string {
	return fmt.Sprintf("s3://%s/%s?endpoint=%s&insecure=1&retries=2", Bucket, prefix, s.Addr)
}

// Open opens the store of URL(prefix).
func (s *Server) Open(prefix string) objstore.Store {
	s.t.Helper()
	st, err := objstore.Open(s.URL(prefix), s.Credentials())
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// Restart starts the server (again, after Stop) on the same address and
// directory and returns once it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.srv.Start(context.Background()); err != nil {
		s.t.Fatalf("s3test: %v", err)
	}
}

// PID is the running server's process ID (0 when stopped).
func (s *Server) PID() int { return s.srv.PID() }

// Stop kills the server (SIGKILL, as a crash would) and waits for it to
// exit; the directory stays for Restart. Stopping a stopped server does
// nothing.
func (s *Server) Stop() { s.srv.Stop() }
