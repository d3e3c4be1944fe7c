// Package pgserver runs a PostgreSQL server of its own as a child
// process: a cluster made with initdb in a directory (or the one already
// there), served by the system's PostgreSQL binaries on a unix socket
// only, with trust authentication for the superuser "postgres". It owns
// that process: Stop shuts it down (fast shutdown, then SIGKILL of its
// process group), and the kernel stops it too if the process that started
// it dies first (the parent-death signal). Tests use it through
// catalog/pgtest; `panda dev cluster` keeps its catalog in it.
//
// It needs the Debian postgresql package (`make setup`); a cluster that
// package may run as a service is never used.
package pgserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pandastack/pandastack/internal/testing/child"
)

const (
	// startTimeout bounds initdb plus the server's first accepted
	// connection; stopTimeout bounds a fast shutdown.
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	// Superuser is the role initdb creates; trust authentication.
	Superuser = "postgres"
	// maxSocketDir is the longest socket directory: a unix socket path
	// (DIR/.s.PGSQL.5432) must fit in 107 bytes.
	maxSocketDir = 90
)

// ErrMissing: the PostgreSQL server binaries are not installed.
var ErrMissing = errors.New("PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or PATH; run `make setup` to install PostgreSQL")

// Config says where a server keeps its cluster.
type Config struct {
	// Dir holds the cluster (Dir/data, made by initdb when missing), the
	// server's log (Dir/postgres.log) and, unless SocketDir is set, its
	// socket. Start creates it. When this process is root, the server
	// runs as the postgres system user (or nobody), since PostgreSQL
	// refuses root: Dir is then given to that user, and its parents must
	// let that user pass (mode o+x).
	Dir string
	// SocketDir is where the server's unix socket goes ("" is Dir); at
	// most 90 bytes long.
	SocketDir string
	// Durable keeps PostgreSQL's durability settings; false turns off
	// fsync, synchronous commits and full-page writes, for data that is
	// thrown away (tests).
	Durable bool
}

// Server is a running postgres process.
type Server struct {
	cfg    Config
	dsn    string
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	err    error         // its exit status, once exited is closed
	log    string        // path of its log

	// InitDB is how long initdb took (0: the cluster existed); Ready how
	// long Start took in all.
	InitDB, Ready time.Duration
	// Binaries is the directory of the PostgreSQL binaries used.
	Binaries string
}

// Start runs the server of cfg and returns once it accepts connections.
// On failure nothing is left running.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	initdb, postgres, err := binaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	if cfg.SocketDir == "" {
		cfg.SocketDir = cfg.Dir
	}
	if len(cfg.SocketDir) > maxSocketDir {
		return nil, fmt.Errorf("postgres socket directory %s: longer than %d bytes", cfg.SocketDir, maxSocketDir)
	}
	for _, d := range []string{cfg.Dir, cfg.SocketDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		if cred != nil {
			if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}
	data := filepath.Join(cfg.Dir, "data")
	attr := func() *syscall.SysProcAttr {
		// Setpgid keeps a terminal's ^C from reaching the server (Stop
		// stops it) and lets Stop kill the whole group. The parent-death
		// signal (child.Start) takes the server down if this process dies
		// without stopping it; Go sets it after changing credentials,
		// which would clear it.
		return &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	}
	env := []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "TZ=UTC", "HOME=" + cfg.Dir}

	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s := &Server{cfg: cfg, exited: make(chan struct{}), log: filepath.Join(cfg.Dir, "postgres.log"),
		Binaries: filepath.Dir(postgres)}
	if _, err := os.Stat(filepath.Join(data, "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		os.RemoveAll(data) // a half-made cluster of an interrupted initdb
		args := []string{"-D", data, "-U", Superuser, "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions"}
		if !cfg.Durable {
			args = append(args, "--no-sync")
		}
		cmd := exec.CommandContext(ctx, initdb, args...)
		cmd.Dir, cmd.Env, cmd.SysProcAttr = cfg.Dir, env, attr()
		// On timeout, kill initdb's whole group: it runs postgres itself.
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		waited, err := child.Start(cmd, syscall.SIGKILL)
		if err == nil {
			err = <-waited
		}
		if err != nil {
			return nil, fmt.Errorf("initdb: %v\n%s", err, out.Bytes())
		}
		s.InitDB = time.Since(began)
	}

	removeStaleLock(filepath.Join(data, "postmaster.pid"))
	removeStaleLock(filepath.Join(cfg.SocketDir, ".s.PGSQL.5432.lock"))
	logFile, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the server has its own descriptor
	if cred != nil {
		os.Chown(s.log, int(cred.Uid), int(cred.Gid))
	}
	args := []string{"-D", data, "-k", cfg.SocketDir, "-c", "listen_addresses=", "-c", "max_connections=200"}
	if !cfg.Durable {
		// Data that is thrown away: skip durability.
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	srv := exec.Command(postgres, args...)
	srv.Dir, srv.Env, srv.SysProcAttr = cfg.Dir, env, attr()
	srv.Stdout, srv.Stderr = logFile, logFile
	waited, err := child.Start(srv, syscall.SIGQUIT)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s.cmd = srv
	go func() {
		s.err = <-waited
		close(s.exited)
	}()
	s.dsn = (&url.URL{
		Scheme:   "postgres",
		User:     url.User(Superuser),
		Path:     "/postgres",
		RawQuery: url.Values{"host": {cfg.SocketDir}, "sslmode": {"disable"}}.Encode(),
	}).String()
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%v\nserver log:\n%s", err, s.ReadLog())
	}
	s.Ready = time.Since(began)
	return s, nil
}

// DSN is the URL of the server's "postgres" database, e.g.
// postgres://postgres@/postgres?host=/tmp/pgtest-123&sslmode=disable.
func (s *Server) DSN() string { return s.dsn }

// PID is the postmaster's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Exited is closed when the server has exited; Err then says how.
func (s *Server) Exited() <-chan struct{} { return s.exited }

// Err is the server's exit status, once Exited is closed.
func (s *Server) Err() error { return s.err }

// ReadLog returns the server's log.
func (s *Server) ReadLog() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// waitReady polls until the server accepts a connection, it exits, or ctx
// ends.
func (s *Server) waitReady(ctx context.Context) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgconn.Connect(cctx, s.dsn)
		if err == nil {
			err = conn.Close(cctx)
			cancel()
			return err
		}
		cancel()
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited while starting: %v (last connection error: %v)", s.err, err)
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready within %v: %v", startTimeout, err)
		case <-tick.C:
		}
	}
}

// Stop shuts the server down (SIGINT: fast shutdown, which ends sessions
// and waits for every server process) and, if that takes longer than 30
// s, kills its whole process group and says so. It returns at once if
// the server has exited. Idempotent.
func (s *Server) Stop() error {
	select {
	case <-s.exited:
		return nil
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	select {
	case <-s.exited:
		return nil
	case <-time.After(stopTimeout):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		return fmt.Errorf("stop postgres: no fast shutdown within %v; killed it", stopTimeout)
	}
}

// binaries finds initdb and postgres: Debian's newest
// /usr/lib/postgresql/N/bin, else the PATH.
func binaries() (initdb, postgres string, err error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if isExec(i) && isExec(p) {
			return i, p, nil
		}
	}
	i, ierr := exec.LookPath("initdb")
	p, perr := exec.LookPath("postgres")
	if ierr == nil && perr == nil {
		return i, p, nil
	}
	return "", "", ErrMissing
}

// version returns N of /usr/lib/postgresql/N/bin (0 if not a number).
func version(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func isExec(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// serverUser returns the credentials to run PostgreSQL with: nil (this
// process's) unless we are root, which PostgreSQL refuses.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and no postgres or nobody user to run PostgreSQL as")
}

// removeStaleLock removes a lock file (postmaster.pid, the socket's
// .lock) of a postmaster that died but is not reaped yet: PostgreSQL sees
// a zombie as a live postmaster and would refuse to start (its parent was
// killed, and whoever inherited it has not waited for it yet). A lock
// file of a live process, or of one that is gone, is left to PostgreSQL.
func removeStaleLock(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return
	}
	if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
		os.Remove(path)
	}
}
