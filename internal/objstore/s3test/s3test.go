// Package s3test runs a real S3-compatible server for tests: versitygw
// (github.com/versity/versitygw, its posix backend serving a temporary
// directory) as a child process on a free loopback port. `make s3-deps`
// builds the binary; a test that needs it fails, with the command that
// builds it, when it is missing — it never skips.
//
// The server is killed by its process ID when the test ends, whether it
// passed or not, and also if the test binary dies first (the parent-death
// signal).
package s3test

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/objstore"
)

// Version is the versitygw release the tests run; the Makefile's
// VERSITYGW_VERSION names the same one.
const Version = "v1.8.0"

// Bucket is the bucket every Server starts with.
const Bucket = "panda-test"

// BuildHelp says how to build the binary.
const BuildHelp = "build it with `make s3-deps` (go install github.com/versity/versitygw/cmd/versitygw@" + Version + " into ~/.cache/pandastack-tools, renamed versitygw-" + Version + "), or set PANDA_VERSITYGW to its path"

// Binary returns the path of the versitygw binary: $PANDA_VERSITYGW (the
// Makefile sets it) or <user cache dir>/pandastack-tools/versitygw-<Version>.
func Binary() (string, error) {
	if p := os.Getenv("PANDA_VERSITYGW"); p != "" {
		return p, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "pandastack-tools", "versitygw-"+Version), nil
}

// Server is one running versitygw.
type Server struct {
	Addr      string // 127.0.0.1:port
	Dir       string // the posix backend's root; the bucket is Dir/Bucket
	AccessKey string
	SecretKey string

	t    testing.TB
	bin  string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start runs a server with an empty bucket named Bucket; it is stopped
// when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("s3test: %v", err)
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatalf("s3test: versitygw %s is not usable at %s (%v): %s", Version, bin, err, BuildHelp)
	}
	if v := info.Main.Version; v != Version {
		t.Fatalf("s3test: %s is versitygw %s, want %s: %s", bin, v, Version, BuildHelp)
	}
	tmp := t.TempDir()
	s := &Server{
		Addr:      freeAddr(t),
		Dir:       filepath.Join(tmp, "data"),
		AccessKey: "pandatest",
		SecretKey: "pandatest-secret",
		t:         t,
		bin:       bin,
		log:       filepath.Join(tmp, "versitygw.log"),
	}
	if err := os.Mkdir(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.Restart()
	st, err := objstore.OpenS3(objstore.S3Config{Bucket: Bucket, Endpoint: s.Addr, Insecure: true, Retries: 1, Credentials: s.Credentials()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.MakeBucket(ctx); err != nil {
		t.Fatalf("s3test: make bucket: %v\n%s", err, s.logTail())
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
func (s *Server) Credentials() objstore.Credentials {
	return objstore.Credentials{AccessKey: s.AccessKey, SecretKey: s.SecretKey}
}

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
	if s.cmd != nil {
		s.t.Fatal("s3test: Restart of a running server")
	}
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(s.bin, "--access", s.AccessKey, "--secret", s.SecretKey,
		"--port", s.Addr, "--quiet", "posix", s.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Pdeathsig belongs to the thread that forks: keep this goroutine on
	// it until the fork is done.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("s3test: start %s: %v", s.bin, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(s.done)

	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.done:
			s.cmd = nil
			s.t.Fatalf("s3test: versitygw exited before it listened on %s:\n%s", s.Addr, s.logTail())
		case <-time.After(20 * time.Millisecond): // poll interval of the connect loop
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("s3test: versitygw does not listen on %s after 15 s:\n%s", s.Addr, s.logTail())
		}
	}
}

// Stop kills the server (SIGKILL, as a crash would) and waits for it to
// exit; the directory stays for Restart. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(s.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
}
