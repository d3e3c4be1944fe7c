package guest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

const pumpBuffer = 32 << 10

// exec runs one process on stream st.
//
// Protocol: REPLY {pid} once the process runs (or REPLY {error}: not_found
// for a missing executable or cwd, permission, invalid); DATA with stdout,
// DATA|STDERR with stderr, as produced; EXIT {exec}; CLOSE. The host's DATA
// is stdin and its CLOSE closes stdin. A RESET from the host, or the
// timeout, kills the process group with SIGKILL. If the session is replaced
// the process keeps running and its output is discarded. When ctx ends (the
// agent stops) the process group is killed.
func (s *Server) exec(ctx context.Context, st *guestproto.Stream, req *guestproto.ExecRequest) {
	if req == nil {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "exec request missing"))
		return
	}
	if err := req.Validate(); err != nil {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "%v", err))
		return
	}
	if req.PTY != nil {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "a terminal is for background processes (proc_start), not exec"))
		return
	}
	path, argv, env, cwd, cred, err := s.prepare(req)
	if err != nil {
		replyErr(st, err)
		return
	}
	p, err := s.startProcess(path, argv, env, cwd, cred, req.Stdin)
	if err != nil {
		replyErr(st, fmt.Errorf("start %s: %w", argv[0], err))
		return
	}
	defer p.closeAll()
	if err := st.Reply(guestproto.Reply{PID: p.pid}); err != nil {
		// The session is gone already; the process runs on unwatched.
		s.log.Error("send exec reply", "pid", p.pid, "err", err)
	}

	var pumps sync.WaitGroup
	pumps.Add(2)
	go pump(&pumps, p.stdout, st.Write)
	go pump(&pumps, p.stderr, st.WriteStderr)
	if p.stdin != nil {
		go feedStdin(st, p.stdin)
	} else {
		st.DiscardInput()
	}

	start := time.Now()
	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws syscall.WaitStatus
	timedOut := false
	aborted := st.Done()
	stopping := ctx.Done()
wait:
	for {
		select {
		case ws = <-p.wait:
			break wait
		case <-timeout:
			timeout = nil
			timedOut = true
			killGroup(p.pid)
		case <-aborted:
			aborted = nil
			if !errors.Is(st.Err(), guestproto.ErrSessionReset) {
				killGroup(p.pid)
			}
		case <-stopping:
			stopping = nil
			killGroup(p.pid)
		}
	}
	res := guestproto.ExecResult{DurationMS: time.Since(start).Milliseconds(), TimedOut: timedOut}
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = unix.SignalName(ws.Signal())
	}

	// Children may still hold the pipes; stream what they write for a grace
	// period, then cut them off.
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	grace := time.NewTimer(s.cfg.ExitGrace)
	defer grace.Stop()
	select {
	case <-drained:
	case <-grace.C:
		_ = p.stdout.Close()
		_ = p.stderr.Close()
		<-drained
	}
	_ = st.Exit(guestproto.Reply{Exec: &res})
}

// prepare resolves a validated request: the executable's path, argv, the
// environment, the working directory and the credential (nil: root).
func (s *Server) prepare(req *guestproto.ExecRequest) (path string, argv, env []string, cwd string, cred *syscall.Credential, err error) {
	argv = req.Argv
	login := false
	if req.Shell != "" {
		argv, login = s.shell.argv(req.Shell)
	}
	var userEnv map[string]string
	if req.User != "" {
		u, err := resolveUser(s.cfg.Root, req.User)
		if err != nil {
			return "", nil, nil, "", nil, err
		}
		cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
		if cred.Groups == nil {
			cred.Groups = []uint32{} // drop the agent's own supplementary groups
		}
		// Without a passwd entry, as in Docker: HOME=/, no USER or LOGNAME
		// (the agent's own would name root).
		userEnv = map[string]string{"HOME": "/", "USER": "", "LOGNAME": ""}
		if u.name != "" {
			userEnv = map[string]string{"HOME": cmp.Or(u.home, "/"), "USER": u.name, "LOGNAME": u.name}
		}
	}
	envMap, explicit := s.execEnv(userEnv, req.Env)
	path, err = lookPath(argv[0], envMap["PATH"])
	if err != nil && req.Shell != "" && argv[0] != "/bin/sh" {
		// bash was removed since its stat was cached.
		s.shell.forget()
		argv, login = s.shell.argv(req.Shell)
		path, err = lookPath(argv[0], envMap["PATH"])
	}
	if err != nil {
		return "", nil, nil, "", nil, err
	}
	cwd, err = execDir(req.Cwd, envMap["HOME"])
	if err != nil {
		return "", nil, nil, "", nil, err
	}
	if login {
		if err := s.shell.keepExplicit(envMap, explicit); err != nil {
			return "", nil, nil, "", nil, err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(envMap)) {
		env = append(env, k+"="+envMap[k])
	}
	return path, argv, env, cwd, cred, nil
}

// process is a started exec and the parent's ends of its pipes.
type process struct {
	pid                   int
	wait                  <-chan syscall.WaitStatus
	stdin, stdout, stderr *os.File // stdin is nil without Stdin
}

func (p *process) closeAll() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} { // a PTY's stdin is its stdout: closed twice, harmlessly
		if f != nil {
			_ = f.Close()
		}
	}
}

// startProcess starts argv in its own process group with piped output, as
// cred (nil: the agent's own user, root).
func (s *Server) startProcess(path string, argv, env []string, cwd string, cred *syscall.Credential, withStdin bool) (_ *process, err error) {
	var parent, child []*os.File
	defer func() {
		for _, f := range child {
			_ = f.Close()
		}
		if err != nil {
			for _, f := range parent {
				_ = f.Close()
			}
		}
	}()
	p := &process{}
	if withStdin {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		parent, child = append(parent, w), append(child, r)
		p.stdin = w
	} else {
		null, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		child = append(child, null)
	}
	for _, dst := range []**os.File{&p.stdout, &p.stderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		parent, child = append(parent, r), append(child, w)
		*dst = r
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{child[0].Fd(), child[1].Fd(), child[2].Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: cred},
	}
	p.pid, p.wait, err = s.reaper.Start(path, argv, attr)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// killGroup kills the process group led by pid.
func killGroup(pid int) {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// pump streams r to write until r ends. Once write fails (the stream was
// reset or its session replaced) it keeps draining r so the process never
// blocks on a full pipe.
func pump(wg *sync.WaitGroup, r *os.File, write func([]byte) (int, error)) {
	defer wg.Done()
	buf := make([]byte, pumpBuffer)
	live := true
	for {
		n, err := r.Read(buf)
		if n > 0 && live {
			if _, werr := write(buf[:n]); werr != nil {
				live = false
			}
		}
		if err != nil {
			return
		}
	}
}

// feedStdin copies the host's DATA to the process's stdin and closes it at the
// host's CLOSE. If the process stops reading, the rest is discarded.
func feedStdin(st *guestproto.Stream, w *os.File) {
	defer w.Close()
	buf := make([]byte, pumpBuffer)
	for {
		n, err := st.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				st.DiscardInput()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// lookPath finds an executable like a shell would, in the exec's PATH.
func lookPath(file, pathEnv string) (string, error) {
	if strings.Contains(file, "/") {
		if err := executable(file); err != nil {
			return "", err
		}
		return file, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", guestproto.Errorf(guestproto.CodeNotFound, "executable %q not found in PATH", file)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return guestproto.Errorf(guestproto.CodeNotFound, "executable %q not found", p)
	case err != nil:
		return err
	case fi.IsDir():
		return guestproto.Errorf(guestproto.CodeIsDir, "%q is a directory", p)
	case fi.Mode()&0o111 == 0:
		return guestproto.Errorf(guestproto.CodePermission, "%q is not executable", p)
	}
	return nil
}

// execDir picks and checks the working directory.
func execDir(cwd, home string) (string, error) {
	if cwd == "" {
		if fi, err := os.Stat(home); home != "" && err == nil && fi.IsDir() {
			return home, nil
		}
		return "/", nil
	}
	fi, err := os.Stat(cwd)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", guestproto.Errorf(guestproto.CodeNotFound, "cwd %q does not exist", cwd)
	case err != nil:
		return "", fmt.Errorf("cwd: %w", err)
	case !fi.IsDir():
		return "", guestproto.Errorf(guestproto.CodeNotDir, "cwd %q is not a directory", cwd)
	}
	return cwd, nil
}
