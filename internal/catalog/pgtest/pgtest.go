// Package pgtest starts throwaway PostgreSQL servers for tests: a fresh
// cluster (initdb) in a temporary directory, served by the system's
// PostgreSQL binaries on a unix socket only, stopped and removed when the
// test ends. It needs the Debian postgresql package (`make setup`); the
// cluster that package may run as a service is never used.
package pgtest

import (
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// startTimeout bounds initdb plus the server's first accepted
	// connection; stopTimeout bounds a fast shutdown.
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
	// superuser is the role initdb creates; trust authentication.
	superuser = "postgres"
)

// Start runs a new PostgreSQL server for the duration of the test and
// returns the URL of its "postgres" database, e.g.
// postgres://postgres@/postgres?host=/tmp/pgtest-123&sslmode=disable.
// The server stops (and its files are removed) in t.Cleanup, whether the
// test passed or not. When the test runs as root the server runs as the
// postgres system user (or nobody), since PostgreSQL refuses root.
func Start(t testing.TB) string {
	t.Helper()
	initdb, postgres, err := binaries()
	if err != nil {
		t.Fatalf("start postgres: %v; run `make setup` to install PostgreSQL", err)
	}
	cred, err := serverUser()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}

	dir, err := socketDir()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove postgres directory: %v", err)
		}
	})
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("start postgres: %v", err)
		}
	}
	data := filepath.Join(dir, "data")
	attr := func() *syscall.SysProcAttr {
		// Setpgid keeps a terminal's ^C from reaching the server (the
		// test's cleanup stops it) and lets stop kill the whole group.
		// Pdeathsig takes the server down if the test binary dies
		// without cleaning up; Go sets it after changing credentials,
		// which would clear it.
		return &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: syscall.SIGQUIT}
	}
	env := []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "TZ=UTC", "HOME=" + dir}

	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, initdb, "-D", data, "-U", superuser, "--auth=trust", "--encoding=UTF8",
		"--locale=C", "--no-sync", "--no-instructions")
	cmd.Dir, cmd.Env, cmd.SysProcAttr = dir, env, attr()
	// On timeout, kill initdb's whole group: it runs postgres itself.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("start postgres: initdb: %v\n%s", err, out)
	}
	initialized := time.Now()

	logPath := filepath.Join(dir, "postgres.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	defer logFile.Close() // the server has its own descriptor
	srv := exec.Command(postgres, "-D", data, "-k", dir,
		"-c", "listen_addresses=",
		"-c", "max_connections=200",
		// A test server's data is thrown away: skip durability.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	srv.Dir, srv.Env, srv.SysProcAttr = dir, env, attr()
	srv.Stdout, srv.Stderr = logFile, logFile
	if err := srv.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	s := &server{cmd: srv, exited: make(chan struct{}), log: logPath}
	go func() {
		s.err = srv.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() { s.stop(t) })

	dsn := (&url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Path:     "/postgres",
		RawQuery: url.Values{"host": {dir}, "sslmode": {"disable"}}.Encode(),
	}).String()
	if err := s.waitReady(ctx, dsn); err != nil {
		t.Fatalf("start postgres: %v\nserver log:\n%s", err, s.readLog())
	}
	s.ready = true
	t.Logf("postgres %s ready in %v (initdb %v) at %s", filepath.Base(filepath.Dir(filepath.Dir(postgres))),
		time.Since(began).Round(time.Millisecond), initialized.Sub(began).Round(time.Millisecond), dir)
	return dsn
}

// server is a running postgres process.
type server struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been waited for
	err    error         // its exit status, once exited is closed
	log    string        // path of its log
	ready  bool          // it accepted a connection
}

func (s *server) readLog() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// waitReady polls until the server accepts a connection, it exits, or ctx
// ends.
func (s *server) waitReady(ctx context.Context, dsn string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgconn.Connect(cctx, dsn)
		if err == nil {
			err = conn.Close(cctx)
			cancel()
			return err
		}
		cancel()
		select {
		case <-s.exited:
			return fmt.Errorf("server exited while starting: %v (last connection error: %v)", s.err, err)
		case <-ctx.Done():
			return fmt.Errorf("server not ready within %v: %v", startTimeout, err)
		case <-tick.C:
		}
	}
}

// stop shuts the server down (SIGINT: fast shutdown, which ends sessions
// and waits for every server process) and, if that takes too long, kills
// its whole process group.
func (s *server) stop(t testing.TB) {
	select {
	case <-s.exited:
		if s.ready { // else Start has reported it
			t.Errorf("postgres exited before the end of the test: %v\nserver log:\n%s", s.err, s.readLog())
		}
		return
	default:
	}
	began := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Errorf("stop postgres: %v", err)
	}
	select {
	case <-s.exited:
		t.Logf("postgres stopped in %v", time.Since(began).Round(time.Millisecond))
	case <-time.After(stopTimeout):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		t.Errorf("stop postgres: no fast shutdown within %v; killed it\nserver log:\n%s", stopTimeout, s.readLog())
	}
}

var databases atomic.Int64

// NewDatabase creates an empty database on the server at dsn (a URL as
// Start returns) and returns its URL. Tests sharing one server use it to
// start from a clean state.
func NewDatabase(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("new database: %v", err)
	}
	name := "test_" + strconv.FormatInt(databases.Add(1), 10)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("new database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name).ReadAll(); err != nil {
		t.Fatalf("new database %s: %v", name, err)
	}
	u.Path = "/" + name
	return u.String()
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
	return "", "", errors.New("PostgreSQL server binaries (initdb, postgres) not found in /usr/lib/postgresql/*/bin or PATH")
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

// socketDir creates the server's directory (data, socket, log). A unix
// socket path must fit in 107 bytes, so a long TMPDIR gives way to /tmp.
func socketDir() (string, error) {
	parent := os.TempDir()
	if len(parent) > 60 {
		parent = "/tmp"
	}
	return os.MkdirTemp(parent, "pgtest-")
}
