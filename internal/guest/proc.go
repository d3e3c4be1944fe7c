package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// procTable holds the background processes: started detached from any
// stream, they run and buffer their output (guestproto.ProcOutputMax of
// each of stdout and stderr) whoever is attached. At most
// guestproto.MaxProcsRunning run at once; exited ones are kept with their
// output until removed, up to guestproto.MaxProcsExited (the earliest to
// exit is forgotten first).
//
// The table is plain memory of the agent, so a snapshot or fork captures
// it with the processes themselves: a restored or forked copy lists the
// same processes with the same pids and the output buffered until the
// snapshot, and each copy runs on independently from there.
type procTable struct {
	mu      sync.Mutex
	procs   map[int]*bgProc
	running int // started and not yet exited, including removed ones
}

// bgProc is one background process. mu guards everything below it.
type bgProc struct {
	pid     int
	cmd     string
	started time.Time
	// stdinMu serializes writes to stdin; it is never held with mu.
	stdinMu sync.Mutex

	mu          sync.Mutex
	out, errOut ring
	changed     chan struct{} // closed and replaced at each change
	stdin       *os.File      // nil if started without stdin
	stdinClosed bool
	// pty is the terminal's master of a process started on a PTY (also
	// its stdin, never closed by close_stdin), size its size.
	pty   *os.File
	size  guestproto.PTYSize
	exit  *guestproto.ExecResult
	ended time.Time
	done  chan struct{} // closed once exit is set
}

func (p *bgProc) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *bgProc) info() guestproto.ProcInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := guestproto.ProcInfo{
		PID: p.pid, Cmd: p.cmd, State: guestproto.ProcRunning,
		StartedUnixNano: p.started.UnixNano(),
		StdinOpen:       p.stdin != nil && !p.stdinClosed,
		StdoutEnd:       p.out.end, StderrEnd: p.errOut.end,
		StdoutDropped: p.out.start(), StderrDropped: p.errOut.start(),
	}
	if p.pty != nil {
		size := p.size
		in.PTY = &size
	}
	if p.exit != nil {
		res := *p.exit
		in.State, in.Exit, in.EndedUnixNano = guestproto.ProcExited, &res, p.ended.UnixNano()
	}
	return in
}

func (t *procTable) get(pid int) (*bgProc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.procs[pid]; p != nil {
		return p, nil
	}
	return nil, guestproto.Errorf(guestproto.CodeNotFound, "no background process %d", pid)
}

// procStart starts a background process: REPLY {proc}.
func (s *Server) procStart(ctx context.Context, st *guestproto.Stream, req *guestproto.ExecRequest) {
	if req == nil {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "proc_start request missing"))
		return
	}
	if err := req.Validate(); err != nil {
		replyErr(st, guestproto.Errorf(guestproto.CodeInvalid, "%v", err))
		return
	}
	if req.PTY != nil {
		if _, ok := req.Env["TERM"]; !ok {
			env := maps.Clone(req.Env)
			if env == nil {
				env = map[string]string{}
			}
			env["TERM"] = defaultTerm
			req.Env = env
		}
	}
	path, argv, env, cwd, cred, err := s.prepare(req)
	if err != nil {
		replyErr(st, err)
		return
	}
	t := &s.procs
	t.mu.Lock()
	if t.running >= guestproto.MaxProcsRunning {
		t.mu.Unlock()
		replyErr(st, guestproto.Errorf(guestproto.CodeBusy, "%d background processes are running already, the most a sandbox may run", guestproto.MaxProcsRunning))
		return
	}
	t.running++ // reserved; given back if the start fails
	t.mu.Unlock()
	var proc *process
	if req.PTY != nil {
		proc, err = s.startPTYProcess(path, argv, env, cwd, cred, *req.PTY)
	} else {
		proc, err = s.startProcess(path, argv, env, cwd, cred, req.Stdin)
	}
	if err != nil {
		t.mu.Lock()
		t.running--
		t.mu.Unlock()
		replyErr(st, fmt.Errorf("start %s: %w", argv[0], err))
		return
	}
	bp := &bgProc{
		pid: proc.pid, cmd: guestproto.ProcCmd(req), started: time.Now(),
		out: ring{max: guestproto.ProcOutputMax}, errOut: ring{max: guestproto.ProcOutputMax},
		changed: make(chan struct{}), stdin: proc.stdin, done: make(chan struct{}),
	}
	if req.PTY != nil {
		bp.pty, bp.size = proc.stdout, *req.PTY
	}
	t.mu.Lock()
	t.procs[bp.pid] = bp
	t.mu.Unlock()
	go s.runProc(ctx, bp, proc, time.Duration(req.TimeoutMS)*time.Millisecond)
	info := bp.info()
	_ = st.Reply(guestproto.Reply{PID: bp.pid, Proc: &info})
}

// runProc buffers the output of bp until it exits (killing its group at
// timeout or when the agent stops), then records how it ended.
func (s *Server) runProc(ctx context.Context, bp *bgProc, p *process, timeout time.Duration) {
	var pumps sync.WaitGroup
	buffer := func(f *os.File, r *ring) {
		defer pumps.Done()
		buf := make([]byte, pumpBuffer)
		for {
			n, err := f.Read(buf)
			if n > 0 {
				bp.mu.Lock()
				r.write(buf[:n])
				bp.notifyLocked()
				bp.mu.Unlock()
			}
			if err != nil {
				return
			}
		}
	}
	pumps.Add(1)
	go buffer(p.stdout, &bp.out)
	if p.stderr != nil { // nil on a PTY: all is stdout
		pumps.Add(1)
		go buffer(p.stderr, &bp.errOut)
	}

	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	var ws syscall.WaitStatus
	timedOut := false
	stopping := ctx.Done()
wait:
	for {
		select {
		case ws = <-p.wait:
			break wait
		case <-timer:
			timer, timedOut = nil, true
			killGroup(p.pid)
		case <-stopping:
			stopping = nil
			killGroup(p.pid)
		}
	}
	res := guestproto.ExecResult{DurationMS: time.Since(bp.started).Milliseconds(), TimedOut: timedOut}
	switch {
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	case ws.Signaled():
		res.ExitCode = 128 + int(ws.Signal())
		res.Signal = unix.SignalName(ws.Signal())
	}
	// As for exec: children holding the pipes get a grace period.
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	grace := time.NewTimer(s.cfg.ExitGrace)
	select {
	case <-drained:
	case <-grace.C:
		p.closeAll()
		<-drained
	}
	grace.Stop()
	p.closeAll() // also stdin: a writer blocked on it fails

	bp.mu.Lock()
	bp.exit, bp.ended, bp.stdinClosed = &res, time.Now(), true
	bp.notifyLocked()
	close(bp.done)
	bp.mu.Unlock()

	t := &s.procs
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running--
	var exited []*bgProc
	for _, q := range t.procs {
		if q.isExited() {
			exited = append(exited, q)
		}
	}
	if len(exited) <= guestproto.MaxProcsExited {
		return
	}
	slices.SortFunc(exited, func(a, b *bgProc) int { return a.endedAt().Compare(b.endedAt()) })
	for _, q := range exited[:len(exited)-guestproto.MaxProcsExited] {
		delete(t.procs, q.pid)
	}
}

func (p *bgProc) isExited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *bgProc) endedAt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ended
}

// procList: REPLY {}, then one JSON ProcInfo per line, by pid.
func (s *Server) procList(st *guestproto.Stream) {
	s.procs.mu.Lock()
	procs := make([]*bgProc, 0, len(s.procs.procs))
	for _, p := range s.procs.procs {
		procs = append(procs, p)
	}
	s.procs.mu.Unlock()
	slices.SortFunc(procs, func(a, b *bgProc) int { return a.pid - b.pid })
	if err := st.Reply(guestproto.Reply{}); err != nil {
		return
	}
	bw := bufio.NewWriterSize(st, pumpBuffer)
	enc := json.NewEncoder(bw)
	for _, p := range procs {
		if err := enc.Encode(p.info()); err != nil {
			return
		}
	}
	_ = bw.Flush()
}

// procOp serves the proc_* operations that name a process.
func (s *Server) procOp(ctx context.Context, st *guestproto.Stream, op guestproto.Op, req *guestproto.ProcRequest) {
	if err := req.Validate(op); err != nil {
		replyErr(st, err)
		return
	}
	bp, err := s.procs.get(req.PID)
	if err != nil {
		replyErr(st, err)
		return
	}
	switch op {
	case guestproto.OpProcStdin:
		replyResult(st, bp.writeStdin(req.Data, req.CloseStdin))
	case guestproto.OpProcSignal:
		replyResult(st, bp.signal(req.Signal))
	case guestproto.OpProcResize:
		replyResult(st, bp.resize(guestproto.PTYSize{Rows: req.Rows, Cols: req.Cols}))
	case guestproto.OpProcRemove:
		if !bp.isExited() {
			killGroup(bp.pid)
		}
		s.procs.mu.Lock()
		if s.procs.procs[bp.pid] == bp {
			delete(s.procs.procs, bp.pid)
		}
		s.procs.mu.Unlock()
		replyResult(st, nil)
	case guestproto.OpProcWait:
		info := bp.info()
		if err := st.Reply(guestproto.Reply{Proc: &info}); err != nil {
			return
		}
		select {
		case <-bp.done:
		case <-st.Done():
			return
		case <-ctx.Done():
			return
		}
		info = bp.info()
		_ = st.Exit(guestproto.Reply{Proc: &info})
	case guestproto.OpProcAttach:
		s.procAttach(ctx, st, bp, req)
	}
}

func (p *bgProc) writeStdin(data []byte, closeStdin bool) error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	p.mu.Lock()
	f, closed, exited := p.stdin, p.stdinClosed, p.exit != nil
	p.mu.Unlock()
	switch {
	case exited && closeStdin && len(data) == 0:
		// Nothing more would be read anyway: a client that writes its
		// last input and then closes (two requests) must not fail
		// because the process finished in between.
		return nil
	case exited:
		return guestproto.Errorf(guestproto.CodeExited, "process %d has exited", p.pid)
	case f == nil:
		return guestproto.Errorf(guestproto.CodeInvalid, "process %d was started without stdin", p.pid)
	case closed:
		if closeStdin && len(data) == 0 {
			return nil
		}
		return guestproto.Errorf(guestproto.CodeExited, "the stdin of process %d is closed", p.pid)
	}
	if len(data) > 0 {
		if _, err := f.Write(data); err != nil {
			return guestproto.Errorf(guestproto.CodeExited, "process %d does not read its stdin any more: %v", p.pid, err)
		}
	}
	if closeStdin {
		p.mu.Lock()
		p.stdinClosed = true
		p.notifyLocked()
		p.mu.Unlock()
		if p.pty == nil { // a terminal's master is also its output
			_ = f.Close()
		}
	}
	return nil
}

// parseSignal accepts "TERM", "SIGTERM", "term" or a number.
func parseSignal(name string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(name); err == nil {
		if n < 1 || n > 64 {
			return 0, guestproto.Errorf(guestproto.CodeInvalid, "signal %d is out of range 1 to 64", n)
		}
		return syscall.Signal(n), nil
	}
	up := strings.ToUpper(name)
	if !strings.HasPrefix(up, "SIG") {
		up = "SIG" + up
	}
	if sig := unix.SignalNum(up); sig != 0 {
		return sig, nil
	}
	return 0, guestproto.Errorf(guestproto.CodeInvalid, "unknown signal %q (use a name such as TERM, KILL, INT, HUP or a number)", name)
}

func (p *bgProc) signal(name string) error {
	sig, err := parseSignal(name)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock() // held so the pid cannot be reaped and reused meanwhile
	if p.exit != nil {
		return guestproto.Errorf(guestproto.CodeExited, "process %d has exited", p.pid)
	}
	// The process group, as for a timeout: a shell's children get it too.
	if err := syscall.Kill(-p.pid, sig); err != nil {
		if err := syscall.Kill(p.pid, sig); err != nil {
			return fmt.Errorf("signal process %d: %w", p.pid, err)
		}
	}
	return nil
}

// procAttach: REPLY {proc, attach}, then stdout as DATA and stderr as
// DATA|STDERR from the requested offsets as they come, then EXIT {proc}
// once the process has exited and all its output was sent, or EXIT
// {proc, lagged} if the host read so slowly that the ring buffer dropped
// bytes not yet sent.
func (s *Server) procAttach(ctx context.Context, st *guestproto.Stream, bp *bgProc, req *guestproto.ProcRequest) {
	bp.mu.Lock()
	// -1 and offsets past the end start at the end; offsets no longer
	// kept at the earliest kept.
	from := func(r *ring, off int64) int64 {
		if off == -1 || off > r.end {
			return r.end
		}
		return max(off, r.start())
	}
	outOff := from(&bp.out, req.StdoutOffset)
	errOff := from(&bp.errOut, req.StderrOffset)
	bp.mu.Unlock()
	info := bp.info()
	if err := st.Reply(guestproto.Reply{Proc: &info, Attach: &guestproto.AttachStart{StdoutOffset: outOff, StderrOffset: errOff}}); err != nil {
		return
	}
	st.DiscardInput()
	stop := make(chan struct{})
	var once sync.Once
	lagged := false
	var wg sync.WaitGroup
	follow := func(r *ring, off int64, write func([]byte) (int, error)) {
		defer wg.Done()
		buf := make([]byte, pumpBuffer)
		for {
			bp.mu.Lock()
			if off < r.start() {
				bp.mu.Unlock()
				once.Do(func() { lagged = true; close(stop) })
				return
			}
			n := r.read(off, buf)
			exited, changed := bp.exit != nil, bp.changed
			bp.mu.Unlock()
			if n > 0 {
				if _, err := write(buf[:n]); err != nil {
					return
				}
				off += int64(n)
				continue
			}
			if exited {
				return
			}
			select {
			case <-changed:
			case <-stop:
				return
			case <-st.Done():
				return
			case <-ctx.Done():
				return
			}
		}
	}
	wg.Add(2)
	go follow(&bp.out, outOff, st.Write)
	go follow(&bp.errOut, errOff, st.WriteStderr)
	wg.Wait()
	select {
	case <-st.Done():
		return
	default:
	}
	info = bp.info()
	if !lagged && info.Exit == nil {
		return // the agent stops
	}
	_ = st.Exit(guestproto.Reply{Proc: &info, Lagged: lagged})
}

// replyResult sends REPLY {} or, if err is set, the error.
func replyResult(st *guestproto.Stream, err error) {
	if err != nil {
		replyErr(st, err)
		return
	}
	_ = st.Reply(guestproto.Reply{})
}
