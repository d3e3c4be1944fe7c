package devcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/testing/child"
)

// proc is one child process of the cluster (the control plane or an
// agent), in a process group of its own so that a terminal's ^C reaches
// only the cluster, which stops its children in order. Its stderr (the
// daemon's log) goes to a file; its stdout (the lines meant for people)
// to that file too and, prefixed with its name, to the cluster's output.
// If the cluster's process dies without stopping it, the kernel sends it
// SIGTERM (the parent-death signal).
type proc struct {
	name string
	argv []string
	env  []string
	log  string // its log file
	out  *lockedWriter
	// onExit, if set, is told of an exit that stop or kill did not ask
	// for.
	onExit func(err error)

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	err    error         // how it exited, once exited is closed
	wanted bool          // Stop or Kill ended it
}

// start starts the process (again, after it exited).
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.exited:
		default:
			return fmt.Errorf("%s is running", p.name)
		}
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "--- %s: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(p.argv, " "))
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return err
	}
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = pw, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	waited, err := child.Start(cmd, syscall.SIGTERM)
	pw.Close()
	if err != nil {
		pr.Close()
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.exited, p.err, p.wanted = cmd, make(chan struct{}), nil, false
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			logf.Write(append(sc.Bytes(), '\n'))
			p.out.printf("%-8s %s\n", p.name+":", sc.Text())
		}
		pr.Close()
	}()
	go func(exited chan struct{}) {
		err := <-waited
		<-copied
		logf.Close()
		p.mu.Lock()
		p.err = err
		wanted := p.wanted
		p.mu.Unlock()
		close(exited)
		if !wanted && p.onExit != nil {
			p.onExit(err)
		}
	}(p.exited)
	return nil
}

// pid is the process's ID (0 if it never started).
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the process is running.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// done is closed when the current process exits (nil before start).
func (p *proc) done() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// exitErr is how the last process exited.
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// stop sends SIGTERM and waits up to grace for the exit, then kills the
// process group. It reports an exit other than a clean one after SIGTERM.
func (p *proc) stop(grace time.Duration) error {
	if !p.running() {
		return nil
	}
	p.mu.Lock()
	p.wanted = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if err := p.exitErr(); err != nil {
			return fmt.Errorf("%s: %v after SIGTERM (log: %s)", p.name, err, p.log)
		}
		return nil
	case <-time.After(grace):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return fmt.Errorf("%s: still running %v after SIGTERM: killed (log: %s)", p.name, grace, p.log)
	}
}

// kill kills the process (SIGKILL, as a crash would; not its group: the
// VMMs of an agent survive it, as they would a crash) and waits for it.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	p.mu.Lock()
	p.wanted = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	cmd.Process.Kill()
	<-exited
}

// logTail is the end of the process's log.
func (p *proc) logTail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimSpace(string(bytes.ToValidUTF8(b, nil)))
}

// lockedWriter serializes the lines of several processes.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, format, args...)
}

// startTime is the start time of process pid (field 22 of its stat, in
// clock ticks since boot): with the PID it names one process, whatever
// PIDs are reused later.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}
