package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// procKey names a process of a sandbox.
type procKey struct {
	sandbox string
	pid     int
}

// procMeta is what E2B shows of a process that the guest does not keep:
// its config as Start gave it, and its tag.
type procMeta struct {
	config processConfig
	tag    *string
}

// remember keeps the meta of a process started by Start until it exits.
func (s *Server) remember(k procKey, m procMeta) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.procs) > 10000 {
		clear(s.procs) // entries of killed sandboxes: bounded, not tracked
	}
	s.procs[k] = m
}

func (s *Server) forget(k procKey) {
	s.mu.Lock()
	delete(s.procs, k)
	s.mu.Unlock()
}

// processGuest is the target's host.ProcessGuest, or unimplemented.
// envd's process service is served on background processes: a command
// started by Start is one, identified by its guest pid, so it outlives a
// dropped stream and Connect, SendInput, SendSignal, CloseStdin and List
// reach it. On a Guest that keeps none, Start runs a plain exec and the
// rest answer unimplemented.
func processGuest(t envdTarget, procedure string) (host.ProcessGuest, error) {
	pg, ok := t.g.(host.ProcessGuest)
	if !ok {
		return nil, connect.NewError(connect.CodeUnimplemented,
			fmt.Errorf("%s is not served for this sandbox: its host does not keep background processes", procedure))
	}
	return pg, nil
}

// pid resolves a selector: a pid as is, a tag through the metas of the
// sandbox's processes started with one.
func (s *Server) pid(t envdTarget, sel processSelector) (int, error) {
	switch {
	case sel.PID != nil:
		if *sel.PID == 0 {
			return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process.pid is 0"))
		}
		return int(*sel.PID), nil
	case sel.Tag != nil:
		s.mu.Lock()
		defer s.mu.Unlock()
		for k, m := range s.procs {
			if k.sandbox == t.id && m.tag != nil && *m.tag == *sel.Tag {
				return k.pid, nil
			}
		}
		return 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %s not found", *sel.Tag))
	}
	return 0, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector needs a pid or a tag"))
}

// procError is rpcError for a call on process pid: a process that is
// unknown or has exited is not found, as envd forgets processes when
// they exit.
func (s *Server) procError(err error, pid int) error {
	switch guestproto.CodeOf(err) {
	case guestproto.CodeNotFound:
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
	case guestproto.CodeExited:
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found: %v", pid, err))
	}
	return s.rpcError(err)
}

// startProcess is Start on a ProcessGuest: the command runs as a
// background process (killed at Connect-Timeout-Ms, surviving the client
// going away), streamed from its first byte until it exits.
func (s *Server) startProcess(ctx context.Context, t envdTarget, pg host.ProcessGuest, m *startRequest, g guestproto.ExecRequest, stream *connect.ServerStream[startResponse]) error {
	if d, ok := ctx.Deadline(); ok {
		g.TimeoutMS = max(time.Until(d).Milliseconds(), 1)
	}
	g.Stdin = m.Stdin != nil && *m.Stdin
	info, err := pg.StartProcess(ctx, g)
	if err != nil {
		return s.rpcError(err)
	}
	k := procKey{t.id, info.PID}
	s.remember(k, procMeta{config: m.Process, tag: m.Tag})
	send := lockedSend(func(ev processEvent) error { return stream.Send(&startResponse{Event: ev}) })
	if err := send(processEvent{Start: &startEvent{PID: uint32(info.PID)}}); err != nil {
		return err // the client went away; the process runs on
	}
	exited, err := s.follow(ctx, pg, info.PID, 0, 0, g.PTY != nil, send)
	if exited {
		// envd forgets a process once it has exited; so does the guest,
		// once whoever started it has seen it end.
		s.forget(k)
		go func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := pg.RemoveProcess(rctx, info.PID); err != nil && guestproto.CodeOf(err) != guestproto.CodeNotFound {
				s.log.Debug("remove exited process", "sandbox_id", t.id, "pid", info.PID, "err", err)
			}
		}()
	}
	return err
}

// lockedSend serializes the sends of a stream's pumps and keepalives.
func lockedSend[T any](send func(T) error) func(T) error {
	var mu sync.Mutex
	return func(v T) error {
		mu.Lock()
		defer mu.Unlock()
		return send(v)
	}
}

// keepalive calls ping every keepaliveEvery until stop is called.
func keepalive(ping func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(keepaliveEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				ping()
			}
		}
	}()
	return func() { close(done) }
}

// pumpData sends stdout and stderr as data events (pty ones if pty: a
// PTY's output is all stdout) until both end, and returns how many bytes
// each had. When a send fails (the client went away) it calls gone and
// reads on.
func pumpData(send func(processEvent) error, stdout, stderr io.Reader, pty bool, gone func()) (nOut, nErr int64) {
	var wg sync.WaitGroup
	pump := func(rd io.Reader, stderr bool, n *int64) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			k, err := rd.Read(buf)
			if k > 0 {
				*n += int64(k)
				data := &dataEvent{}
				switch {
				case pty:
					data.PTY = append([]byte(nil), buf[:k]...)
				case stderr:
					data.Stderr = append([]byte(nil), buf[:k]...)
				default:
					data.Stdout = append([]byte(nil), buf[:k]...)
				}
				if send(processEvent{Data: data}) != nil {
					gone()
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(stdout, false, &nOut)
	go pump(stderr, true, &nErr)
	wg.Wait()
	return nOut, nErr
}

// follow streams process pid's output from the offsets (-1: from now) as
// data events (pty ones for a PTY process, whose output is all stdout), with keepalives, then its end event; it re-attaches where
// it stopped if the attach lagged. exited reports that the process's end
// was seen (and sent, unless the send failed). The client going away
// ends the stream, not the process.
func (s *Server) follow(ctx context.Context, pg host.ProcessGuest, pid int, outOff, errOff int64, pty bool, send func(processEvent) error) (exited bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := keepalive(func() { send(processEvent{Keepalive: &struct{}{}}) })
	defer stop()
	for {
		a, err := pg.AttachProcess(ctx, pid, outOff, errOff)
		if err != nil {
			return false, s.streamError(ctx, s.procError(err, pid))
		}
		nOut, nErr := pumpData(send, a.Stdout, a.Stderr, pty, cancel) // client gone: detach
		proc, lagged, err := a.End()
		if err != nil {
			a.Close()
			return false, s.streamError(ctx, s.rpcError(err))
		}
		if lagged {
			outOff, errOff = a.Start.StdoutOffset+nOut, a.Start.StderrOffset+nErr
			continue
		}
		if proc.Exit.TimedOut {
			// As envd: a command killed at Connect-Timeout-Ms ends the
			// stream with deadline_exceeded, not an end event.
			return true, connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command timed out"))
		}
		return true, send(processEvent{End: endOf(*proc.Exit)})
	}
}

// streamError is err, or what ended ctx: the Connect-Timeout-Ms deadline
// or the client going away.
func (s *Server) streamError(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command timed out"))
	}
	return connect.NewError(connect.CodeCanceled, errors.New("the stream was canceled"))
}

// signalStatus is how Go's os.ProcessState (envd's) writes a signal.
var signalStatus = map[string]string{
	"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup",
	"SIGPIPE": "broken pipe", "SIGQUIT": "quit", "SIGABRT": "aborted", "SIGSEGV": "segmentation fault",
	"SIGUSR1": "user defined signal 1", "SIGUSR2": "user defined signal 2", "SIGALRM": "alarm clock",
}

// endOf is the end event of a process that exited so.
func endOf(res guestproto.ExecResult) *endEvent {
	end := &endEvent{ExitCode: int32(res.ExitCode), Exited: res.Signal == "", Status: fmt.Sprintf("exit status %d", res.ExitCode)}
	if res.Signal != "" {
		end.ExitCode = -1
		name, ok := signalStatus[res.Signal]
		if !ok {
			name = strings.ToLower(strings.TrimPrefix(res.Signal, "SIG"))
		}
		end.Status = "signal: " + name
	}
	if end.ExitCode != 0 {
		msg := end.Status
		end.Error = &msg
	}
	return end
}

// connectProcess attaches to a running process: its output from now, then
// its end. A process that has exited is not found.
func (s *Server) connectProcess(ctx context.Context, req *connect.Request[connectRequest], stream *connect.ServerStream[connectResponse]) error {
	t, err := s.target(ctx, req.Header(), "")
	if err != nil {
		return s.rpcError(err)
	}
	pg, err := processGuest(t, "/process.Process/Connect")
	if err != nil {
		return err
	}
	pid, err := s.pid(t, req.Msg.Process)
	if err != nil {
		return err
	}
	// A first attach from now checks the process runs before the start
	// event; the stream then follows from where it began.
	a, err := pg.AttachProcess(ctx, pid, -1, -1)
	if err != nil {
		return s.procError(err, pid)
	}
	a.Close()
	if a.Proc.Exit != nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found: it has exited", pid))
	}
	send := lockedSend(func(ev processEvent) error { return stream.Send(&connectResponse{Event: ev}) })
	if err := send(processEvent{Start: &startEvent{PID: uint32(pid)}}); err != nil {
		return err
	}
	_, err = s.follow(ctx, pg, pid, a.Start.StdoutOffset, a.Start.StderrOffset, a.Proc.PTY != nil, send)
	return err
}

// listProcesses lists the running processes.
func (s *Server) listProcesses(ctx context.Context, t envdTarget, _ *empty) (*listResponse, error) {
	pg, err := processGuest(t, "/process.Process/List")
	if err != nil {
		return nil, err
	}
	procs, err := pg.ListProcesses(ctx)
	if err != nil {
		return nil, err
	}
	out := &listResponse{Processes: []processInfo{}}
	running := map[int]bool{}
	s.mu.Lock()
	for _, p := range procs {
		if p.State != guestproto.ProcRunning {
			continue
		}
		running[p.PID] = true
		info := processInfo{PID: uint32(p.PID), Config: processConfig{Cmd: p.Cmd}}
		if m, ok := s.procs[procKey{t.id, p.PID}]; ok {
			info.Config, info.Tag = m.config, m.tag
		}
		out.Processes = append(out.Processes, info)
	}
	for k := range s.procs {
		if k.sandbox == t.id && !running[k.pid] {
			delete(s.procs, k) // exited while nobody followed it
		}
	}
	s.mu.Unlock()
	return out, nil
}

func (s *Server) sendInput(ctx context.Context, t envdTarget, m *sendInputRequest) (*empty, error) {
	pg, pid, err := s.selected(t, "/process.Process/SendInput", m.Process)
	if err != nil {
		return nil, err
	}
	// A PTY's keystrokes go to its stdin, as a pipe's bytes do.
	in := m.Input.Stdin
	if m.Input.PTY != nil {
		in = m.Input.PTY
	}
	if len(in) == 0 {
		return &empty{}, nil
	}
	if err := pg.WriteProcessStdin(ctx, pid, in); err != nil {
		return nil, s.procError(err, pid)
	}
	return &empty{}, nil
}

func (s *Server) closeStdin(ctx context.Context, t envdTarget, m *closeStdinRequest) (*empty, error) {
	pg, pid, err := s.selected(t, "/process.Process/CloseStdin", m.Process)
	if err != nil {
		return nil, err
	}
	if err := pg.CloseProcessStdin(ctx, pid); err != nil {
		return nil, s.procError(err, pid)
	}
	return &empty{}, nil
}

func (s *Server) sendSignal(ctx context.Context, t envdTarget, m *sendSignalRequest) (*empty, error) {
	pg, pid, err := s.selected(t, "/process.Process/SendSignal", m.Process)
	if err != nil {
		return nil, err
	}
	var sig string
	switch strings.Trim(string(m.Signal), `"`) {
	case "SIGNAL_SIGKILL", "9":
		sig = "KILL"
	case "SIGNAL_SIGTERM", "15":
		sig = "TERM"
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %s", m.Signal))
	}
	if err := pg.SignalProcess(ctx, pid, sig); err != nil {
		return nil, s.procError(err, pid)
	}
	return &empty{}, nil
}

// selected resolves the process of a unary process call.
func (s *Server) selected(t envdTarget, procedure string, sel processSelector) (host.ProcessGuest, int, error) {
	pg, err := processGuest(t, procedure)
	if err != nil {
		return nil, 0, err
	}
	pid, err := s.pid(t, sel)
	if err != nil {
		return nil, 0, err
	}
	return pg, pid, nil
}

// update is Update: a PTY process's new terminal size. A request without
// a pty changes nothing, as in envd.
func (s *Server) update(ctx context.Context, t envdTarget, m *updateRequest) (*empty, error) {
	pg, pid, err := s.selected(t, "/process.Process/Update", m.Process)
	if err != nil {
		return nil, err
	}
	if m.PTY == nil {
		return &empty{}, nil
	}
	z := m.PTY.Size
	if err := (guestproto.PTYSize{Rows: int(z.Rows), Cols: int(z.Cols)}).Validate(); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if err := pg.ResizeProcess(ctx, pid, int(z.Rows), int(z.Cols)); err != nil {
		return nil, s.procError(err, pid)
	}
	return &empty{}, nil
}
