// Package versitygw runs versitygw (github.com/versity/versitygw), an
// S3-compatible server, as a child process serving a local directory
// through its posix backend. It owns that process: started with Start,
// killed by its process ID with Stop, and killed by the kernel too if the
// process that started it dies first (the parent-death signal). Tests use
// it through objstore/s3test; `panda dev cluster` runs its object store
// with it.
//
// The binary is not built here: `make s3-deps` installs the pinned Version
// into the user's cache directory (Binary says where).
package versitygw

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/child"
)

// Version is the versitygw release PandaStack runs; the Makefile's
// VERSITYGW_VERSION names the same one (a test checks).
const Version = "v1.8.0"

// BuildHelp says how to build the binary.
const BuildHelp = "build it with `make s3-deps` (go install github.com/versity/versitygw/cmd/versitygw@" + Version + " into ~/.cache/pandastack-tools, renamed versitygw-" + Version + "), or set PANDA_VERSITYGW to its path"

// ErrMissing: the binary is missing or not the pinned version.
var ErrMissing = errors.New("versitygw not available")

// DefaultBinary is where `make s3-deps` puts the binary:
// <user cache dir>/pandastack-tools/versitygw-<Version>.
func DefaultBinary() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "pandastack-tools", "versitygw-"+Version), nil
}

// Check reports (as ErrMissing, with BuildHelp) a binary that is not the
// pinned versitygw Version.
func Check(bin string) error {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("%w: versitygw %s is not usable at %s (%v): %s", ErrMissing, Version, bin, err, BuildHelp)
	}
	if v := info.Main.Version; v != Version {
		return fmt.Errorf("%w: %s is versitygw %s, want %s: %s", ErrMissing, bin, v, Version, BuildHelp)
	}
	return nil
}

// Config says what a Server serves.
type Config struct {
	Binary    string // the versitygw binary (Check it first)
	Dir       string // the posix backend's root: a bucket is a directory in it
	Addr      string // host:port to listen on
	AccessKey string // the root account's credentials
	SecretKey string
	LogFile   string // its output, appended to
}

// startTimeout bounds how long Start waits for the server to listen.
const startTimeout = 15 * time.Second

// Server is one versitygw process (or none, between Stop and Start).
// Not safe for concurrent use.
type Server struct {
	cfg  Config
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// New returns a server of cfg, not started.
func New(cfg Config) *Server { return &Server{cfg: cfg} }

// Credentials sign requests to the server.
func (s *Server) Credentials() objstore.Credentials {
	return objstore.Credentials{AccessKey: s.cfg.AccessKey, SecretKey: s.cfg.SecretKey}
}

// Start starts the server (again, after Stop) and returns once it
// accepts connections on Addr, or an error with the tail of its log.
func (s *Server) Start(ctx context.Context) error {
	if s.cmd != nil {
		return errors.New("versitygw: already running")
	}
	logf, err := os.OpenFile(s.cfg.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("versitygw log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(s.cfg.Binary, "--access", s.cfg.AccessKey, "--secret", s.cfg.SecretKey,
		"--port", s.cfg.Addr, "--quiet", "posix", s.cfg.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	waited, err := child.Start(cmd, syscall.SIGKILL)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.cfg.Binary, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func(done chan struct{}) { <-waited; close(done) }(s.done)

	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond) // poll interval of the connect loop
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", s.cfg.Addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-s.done:
			s.cmd = nil
			return fmt.Errorf("versitygw exited before it listened on %s:\n%s", s.cfg.Addr, s.LogTail())
		case <-ctx.Done():
			s.Stop()
			return fmt.Errorf("versitygw does not listen on %s after %v:\n%s", s.cfg.Addr, startTimeout, s.LogTail())
		case <-tick.C:
		}
	}
}

// PID is the running server's process ID, or 0.
func (s *Server) PID() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Exited is closed when the running server exits (nil when stopped).
func (s *Server) Exited() <-chan struct{} { return s.done }

// Stop kills the server (SIGKILL, as a crash would: it keeps nothing in
// memory that matters) and waits for it to exit; the directory stays.
// Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// LogTail is the end of the server's log.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(s.cfg.LogFile)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
}

// MakeBucket creates bucket on the running server unless it exists.
func (s *Server) MakeBucket(ctx context.Context, bucket string) error {
	st, err := objstore.OpenS3(objstore.S3Config{Bucket: bucket, Endpoint: s.cfg.Addr, Insecure: true, Retries: 1, Credentials: s.Credentials()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.MakeBucket(ctx); err != nil {
		return fmt.Errorf("make bucket %s: %w\n%s", bucket, err, s.LogTail())
	}
	return nil
}
