package lazymem

import (
	"bufio"
	"context"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The holder process.
//
// A machine restored lazily maps a file of the mount for as long as it
// runs, and every page-cache miss of that mapping is a FUSE read. If the
// FUSE server lives in the agent, an agent that exits (a crash, an
// upgrade) aborts the connection and the machine's next miss is a
// SIGBUS. So the agent (Config.Holder) starts a small process that
// mounts the files and holds the FUSE connection, and serves the mount's
// names and attributes itself. The content it asks of the agent over a
// unix socket (Dir + ".sock", root only): the agent dials it and answers
// its lookups and reads with everything FS does (the chunk cache, the
// store, the template's chunks, working sets, the background fetch).
// While no agent is attached, reads wait (Config.AgentWait); a restarted
// agent attaches again (Mount with the same Config), is told which files
// the mount holds, and serves them on. The holder runs in a session of
// its own, so that signals to the agent's process group miss it, logs
// to Dir + ".log", and exits when the agent asks (Close: unmount), or
// once no agent has been attached and no file open for
// Config.HolderIdle.

// holderEnv carries the holder's configuration (holderConfig, JSON) to
// the process Config.Holder names: HolderMain sees it.
const holderEnv = "PANDA_LAZYMEM_HOLDER"

// holderConfig is what the holder process is told.
type holderConfig struct {
	Dir          string
	Socket       string
	MaxReadAhead int
	AgentWait    time.Duration
	Idle         time.Duration
	Debug        bool
}

// HolderMain runs this process as a lazymem holder and exits, if it was
// started as one (by Mount with Config.Holder naming its executable);
// otherwise it returns at once. Call it first in main (and in TestMain
// of tests whose Config.Holder is the test binary).
func HolderMain() {
	v, ok := os.LookupEnv(holderEnv)
	if !ok {
		return
	}
	os.Unsetenv(holderEnv)
	var c holderConfig
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		fmt.Fprintln(os.Stderr, "lazymem holder: bad configuration:", err)
		os.Exit(2)
	}
	if err := runHolder(c); err != nil {
		fmt.Fprintln(os.Stderr, "lazymem holder:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// wireMsg is one message between the holder and its agent, gob-encoded
// on the socket. Holder to agent: "hello" (Sets: the files the mount
// holds; Pid), "lookup" (Set), "read" (Set, Off, Len). Agent to holder:
// "reply" (ID of the request: Info, N bytes of data, or Err with
// NotExist), and "shutdown" (the holder unmounts, replies, and exits).
type wireMsg struct {
	ID   uint64
	Op   string
	Set  string
	Sets []string
	Pid  int
	Off  int64
	Len  int
	Info fileInfo
	// N is how many bytes of data follow the message on the stream, raw
	// (a read's reply): the holder reads them straight into the buffer
	// of the FUSE read waiting for them.
	N        int
	Err      string
	NotExist bool
}

// HolderPIDs lists the live holder processes serving a mount under dir
// (they log to the mount point's path + ".log", which is their standard
// error): for tools that clean up after a host whose agent was killed.
func HolderPIDs(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", "2"))
		if err != nil || !strings.HasPrefix(target, filepath.Clean(dir)+"/") || !strings.HasSuffix(target, ".log") {
			continue
		}
		if env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil && strings.Contains(string(env), holderEnv+"=") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// socketOf is the holder's socket for mount point dir.
func socketOf(dir string) string { return filepath.Clean(dir) + ".sock" }

// maxSocketPath is the longest path a unix socket can have.
const maxSocketPath = 107

// holder is an FS's link to the holder process serving its mount.
type holder struct {
	fs   *FS
	conn net.Conn
	pid  int
	// proc is the process if this FS started it (to reap it), else nil.
	proc *os.Process
	// exited is closed once a started holder has been reaped.
	exited chan struct{}

	wmu sync.Mutex
	enc *gob.Encoder

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan wireMsg
	done    chan struct{} // closed when the connection ends
}

// attachHolder links f to the holder serving f.cfg.Dir, starting one if
// none answers and start says so.
func attachHolder(f *FS, start bool) (*holder, error) {
	sock := socketOf(f.cfg.Dir)
	if len(sock) > maxSocketPath {
		return nil, fmt.Errorf("lazymem: holder socket path %s is longer than %d bytes", sock, maxSocketPath)
	}
	h := &holder{fs: f, pending: map[uint64]chan wireMsg{}, done: make(chan struct{})}
	conn, err := net.Dial("unix", sock)
	// Another holder only where none listens: one that answers late (a
	// full backlog) still serves the mount, which a second would detach.
	if err != nil && (!start || !(errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED))) {
		return nil, fmt.Errorf("lazymem: holder: %w", err)
	}
	if err != nil {
		if err := h.start(sock); err != nil {
			return nil, err
		}
		if conn, err = net.Dial("unix", sock); err != nil {
			h.kill()
			return nil, fmt.Errorf("lazymem: holder: %w", err)
		}
	} else {
		f.cfg.Log.Info("lazy memory files: attached to the holder serving them", "dir", f.cfg.Dir)
	}
	h.conn, h.enc = conn, gob.NewEncoder(conn)
	hello := make(chan wireMsg, 1)
	go h.serve(gob.NewDecoder(conn), hello)
	select {
	case m := <-hello:
		h.pid = m.Pid
		// The files a previous agent served: resolve them again (their
		// background fetch goes on), so that Stats and FetchAll know them
		// before their machines' next miss.
		for _, set := range m.Sets {
			f.bg.Add(1)
			go func() {
				defer f.bg.Done()
				if _, err := f.open(f.ctx, set); err != nil {
					f.cfg.Log.Error("lazy memory file held across a restart: resolve set", "set", set, "err", err)
				}
			}()
		}
	case <-h.done:
		h.kill()
		return nil, errors.New("lazymem: holder closed the connection")
	case <-time.After(30 * time.Second):
		conn.Close()
		h.kill()
		return nil, errors.New("lazymem: holder did not say hello in 30 s")
	}
	return h, nil
}

// start starts a holder process for f's mount and waits until it serves.
func (h *holder) start(sock string) error {
	c := h.fs.cfg
	cfg, _ := json.Marshal(holderConfig{Dir: c.Dir, Socket: sock, MaxReadAhead: c.MaxReadAhead, AgentWait: c.AgentWait, Idle: c.HolderIdle, Debug: c.Debug})
	logPath := filepath.Clean(c.Dir) + ".log"
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("lazymem: holder log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(c.Holder)
	cmd.Env = []string{holderEnv + "=" + string(cfg), "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stderr = logf
	ready, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	// A session of its own: a signal to the agent's process group (a
	// terminal's Ctrl-C) must not reach the process its machines need.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("lazymem: start holder %s: %w", c.Holder, err)
	}
	h.proc, h.exited = cmd.Process, make(chan struct{})
	go func() { cmd.Wait(); close(h.exited) }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(ready).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) == "ready" {
			c.Log.Info("lazy memory files: started their holder", "pid", cmd.Process.Pid, "dir", c.Dir, "log", logPath)
			return nil
		}
	case <-time.After(30 * time.Second):
	}
	h.kill()
	return fmt.Errorf("lazymem: holder %s did not start (its log: %s): %s", c.Holder, logPath, tail(logPath))
}

// tail is the end of file path, for an error.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	s := strings.TrimSpace(string(b))
	if len(s) > 500 {
		s = s[len(s)-500:]
	}
	return s
}

// kill ends a holder this FS started and failed to link to.
func (h *holder) kill() {
	if h.proc != nil {
		h.proc.Kill()
		<-h.exited
	}
}

// serve reads the holder's requests and answers each in a goroutine of
// its own; the first message, hello, goes to hello.
func (h *holder) serve(dec *gob.Decoder, hello chan<- wireMsg) {
	defer close(h.done)
	first := true
	for {
		var m wireMsg
		if err := dec.Decode(&m); err != nil {
			if h.fs.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				h.fs.cfg.Log.Error("lazy memory files: link to their holder lost", "err", err)
			}
			h.mu.Lock()
			for _, ch := range h.pending {
				close(ch)
			}
			h.pending = nil
			h.mu.Unlock()
			return
		}
		switch {
		case first && m.Op == "hello":
			first = false
			hello <- m
		case m.Op == "reply":
			h.mu.Lock()
			ch := h.pending[m.ID]
			delete(h.pending, m.ID)
			h.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case m.Op == "lookup" || m.Op == "read":
			go h.answer(m)
		}
	}
}

// answer serves one request of the holder.
func (h *holder) answer(m wireMsg) {
	r := wireMsg{ID: m.ID, Op: "reply"}
	var data []byte
	var err error
	switch m.Op {
	case "lookup":
		r.Info, err = h.fs.lookup(h.fs.ctx, m.Set)
	case "read":
		if m.Len < 0 || m.Len > 16<<20 {
			err = fmt.Errorf("read of %d bytes", m.Len)
			break
		}
		bp := readBufs.Get().(*[]byte)
		defer readBufs.Put(bp)
		if cap(*bp) < m.Len {
			*bp = make([]byte, m.Len)
		}
		buf := (*bp)[:m.Len]
		var n int
		n, err = h.fs.read(h.fs.ctx, m.Set, buf, m.Off)
		data = buf[:n]
	}
	if err != nil {
		r.Err, r.NotExist = err.Error(), errors.Is(err, os.ErrNotExist)
	}
	if err := h.send(r, data); err != nil && h.fs.ctx.Err() == nil {
		h.fs.cfg.Log.Warn("lazy memory files: answer their holder", "op", m.Op, "set", m.Set, "err", err)
	}
}

// readBufs are the buffers of reads answered: fresh memory costs a page
// fault per page, more than the copy.
var readBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// send writes m, then data raw (m.N says how much). Without data it
// writes nothing more: the holder may have taken m and closed the
// connection already (a shutdown), and a write to a socket whose peer is
// gone fails (EPIPE) even when it is empty.
func (h *holder) send(m wireMsg, data []byte) error {
	h.wmu.Lock()
	defer h.wmu.Unlock()
	m.N = len(data)
	if err := h.enc.Encode(m); err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	_, err := h.conn.Write(data)
	return err
}

// leave closes the link; the holder keeps the mount for the next agent.
func (h *holder) leave() {
	h.conn.Close()
	<-h.done
}

// shutdown asks the holder to unmount and exit, and waits until it has.
func (h *holder) shutdown() error {
	h.mu.Lock()
	var ch chan wireMsg
	if h.pending != nil {
		h.nextID++
		ch = make(chan wireMsg, 1)
		h.pending[h.nextID] = ch
	}
	id := h.nextID
	h.mu.Unlock()
	var err error
	if ch == nil {
		err = errors.New("lazymem: holder link lost before shutdown")
	} else if err = h.send(wireMsg{ID: id, Op: "shutdown"}, nil); err == nil {
		select {
		case m, ok := <-ch:
			if !ok {
				err = errors.New("lazymem: holder link lost during shutdown")
			} else if m.Err != "" {
				err = fmt.Errorf("lazymem: holder: %s", m.Err)
			}
		case <-time.After(time.Minute):
			err = errors.New("lazymem: holder did not shut down in a minute")
		}
	}
	if err != nil {
		log := filepath.Clean(h.fs.cfg.Dir) + ".log"
		err = fmt.Errorf("%w (the holder's log %s ends: %s)", err, log, tail(log))
		// It did not hear: SIGTERM also makes it unmount and exit (its
		// machines are gone: this is Close).
		if h.pid > 0 && unix.Kill(h.pid, unix.SIGTERM) == nil {
			h.fs.cfg.Log.Warn("lazy memory files: their holder did not take the shutdown; sent it SIGTERM", "pid", h.pid, "err", err)
			err = nil
		}
	}
	h.conn.Close()
	<-h.done
	// Wait for the process to be gone: a caller checks that nothing of
	// the host is left.
	if h.proc != nil {
		select {
		case <-h.exited:
		case <-time.After(10 * time.Second):
		}
	} else if h.pid > 0 {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if unix.Kill(h.pid, 0) != nil {
				break
			}
		}
	}
	return err
}

// runHolder is the holder process: it mounts c.Dir, serves it, and
// takes agents on c.Socket, until told to shut down or idle.
func runHolder(c holderConfig) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("holder_pid", os.Getpid())
	// Pin no directory of the agent's (a data directory to unmount).
	os.Chdir("/")
	if c.AgentWait <= 0 {
		c.AgentWait = 5 * time.Minute
	}
	if c.Idle <= 0 {
		c.Idle = time.Minute
	}
	// Only an explicit shutdown (or SIGTERM) ends it: a hangup or an
	// interrupt meant for the agent must not.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	// The agent found no holder answering on the socket (it dials before
	// it starts one; its data directory is its alone): a file there is a
	// dead holder's. (Dialling it to make sure would attach to a live one
	// as its agent, and drop the real agent's link.)
	os.Remove(c.Socket)
	ln, err := net.Listen("unix", c.Socket)
	if err != nil {
		return err
	}
	defer os.Remove(c.Socket)
	if err := os.Chmod(c.Socket, 0o600); err != nil {
		return err
	}
	s := &holderServer{log: log, wait: c.AgentWait, changed: make(chan struct{}), shutdown: make(chan func(error), 1), started: time.Now()}
	fr, err := mountFront(c.Dir, s, log, c.MaxReadAhead, c.Debug)
	if err != nil {
		return err
	}
	s.fr = fr
	log.Info("serving lazy memory files", "dir", c.Dir, "socket", c.Socket)
	// Ready: stdout is the agent's pipe, and then /dev/null (a write to a
	// pipe nobody reads would kill this process).
	fmt.Println("ready")
	if null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0); err == nil {
		unix.Dup2(int(null.Fd()), 1)
		null.Close()
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			s.attach(conn)
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var reply func(error)
	for reply == nil {
		select {
		case r := <-s.shutdown:
			reply = r
		case <-term:
			reply = func(error) {}
			log.Info("SIGTERM: unmounting")
		case <-tick.C:
			if since := s.idleSince(fr); !since.IsZero() && time.Since(since) > c.Idle {
				reply = func(error) {}
				log.Info("no agent and no file open: unmounting", "idle_for", c.Idle)
			}
		}
	}
	ln.Close()
	err = fr.unmount()
	reply(err)
	s.closeAll()
	return err
}

// holderServer is the holder's backend: it passes lookups and reads to
// the attached agent, waiting for one while none is.
type holderServer struct {
	log  *slog.Logger
	wait time.Duration
	fr   *front

	mu       sync.Mutex
	cur      *agentLink
	changed  chan struct{} // closed when cur changes
	detached time.Time     // when the last agent left (zero: one is attached or none came yet)
	started  time.Time
	shutdown chan func(error) // a shutdown's reply, called after the unmount
	nextID   uint64
}

// agentLink is the holder's connection to one agent.
type agentLink struct {
	s    *holderServer
	conn net.Conn
	wmu  sync.Mutex
	enc  *gob.Encoder

	mu      sync.Mutex
	pending map[uint64]*call
	down    chan struct{}
}

// call is a request of the holder waiting for its reply: dest takes the
// reply's data.
type call struct {
	dest  []byte
	reply chan wireMsg // gets the reply, its N the bytes read into dest
}

// attach makes conn the agent link, replacing (closing) an older one.
func (s *holderServer) attach(conn net.Conn) {
	l := &agentLink{s: s, conn: conn, enc: gob.NewEncoder(conn), pending: map[uint64]*call{}, down: make(chan struct{})}
	s.mu.Lock()
	old := s.cur
	s.cur = l
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
	var sets []string
	if s.fr != nil {
		sets = s.fr.sets()
	}
	s.log.Info("agent attached", "files", len(sets))
	l.send(wireMsg{Op: "hello", Sets: sets, Pid: os.Getpid()})
	go l.serve()
}

// idleSince is since when no agent is attached and no file open; zero
// if one is.
func (s *holderServer) idleSince(fr *front) time.Time {
	s.mu.Lock()
	cur, since := s.cur, s.detached
	if since.IsZero() {
		since = s.started
	}
	s.mu.Unlock()
	if cur != nil {
		return time.Time{}
	}
	idle := fr.idleSince()
	if idle.IsZero() {
		return time.Time{}
	}
	if idle.After(since) {
		return idle
	}
	return since
}

func (s *holderServer) closeAll() {
	s.mu.Lock()
	l := s.cur
	s.mu.Unlock()
	if l != nil {
		l.conn.Close()
	}
}

func (l *agentLink) send(m wireMsg) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.enc.Encode(m)
}

// serve reads the agent's replies and requests until the link ends.
func (l *agentLink) serve() {
	// A bufio.Reader is an io.ByteReader: gob reads from it no further
	// than each message, and the data after a reply is read from it too.
	br := bufio.NewReaderSize(l.conn, 256<<10)
	dec := gob.NewDecoder(br)
	var why error
	for why == nil {
		var m wireMsg
		if why = dec.Decode(&m); why != nil {
			break
		}
		switch m.Op {
		case "reply":
			l.mu.Lock()
			c := l.pending[m.ID]
			delete(l.pending, m.ID)
			l.mu.Unlock()
			if m.N < 0 {
				why = fmt.Errorf("reply of %d bytes", m.N)
				break
			}
			var dest []byte
			if c != nil {
				dest = c.dest[:min(m.N, len(c.dest))]
			}
			if _, why = io.ReadFull(br, dest); why != nil {
				break
			}
			if _, why = br.Discard(m.N - len(dest)); why != nil {
				break
			}
			m.N = len(dest)
			if c != nil {
				c.reply <- m
			}
		case "shutdown":
			id := m.ID
			select {
			case l.s.shutdown <- func(err error) {
				r := wireMsg{ID: id, Op: "reply"}
				if err != nil {
					r.Err = err.Error()
				}
				l.send(r)
			}:
			default:
			}
		}
	}
	l.conn.Close()
	l.mu.Lock()
	close(l.down)
	l.pending = nil
	l.mu.Unlock()
	l.s.mu.Lock()
	if l.s.cur == l {
		l.s.cur = nil
		l.s.detached = time.Now()
		l.s.log.Info("agent left: reads wait for the next one", "wait", l.s.wait, "why", why)
	}
	l.s.mu.Unlock()
}

// errLinkDown is a request whose agent link ended before its answer.
var errLinkDown = errors.New("agent link down")

// call sends m on l and waits for its answer, whose data goes to dest.
func (l *agentLink) call(ctx context.Context, m wireMsg, dest []byte) (wireMsg, error) {
	c := &call{dest: dest, reply: make(chan wireMsg, 1)}
	l.mu.Lock()
	if l.pending == nil {
		l.mu.Unlock()
		return wireMsg{}, errLinkDown
	}
	l.s.mu.Lock()
	l.s.nextID++
	m.ID = l.s.nextID
	l.s.mu.Unlock()
	l.pending[m.ID] = c
	l.mu.Unlock()
	if err := l.send(m); err != nil {
		l.conn.Close()
		return wireMsg{}, errLinkDown
	}
	select {
	case r := <-c.reply:
		return r, nil
	case <-l.down:
		return wireMsg{}, errLinkDown
	case <-ctx.Done():
		l.mu.Lock()
		_, waiting := l.pending[m.ID]
		delete(l.pending, m.ID)
		l.mu.Unlock()
		if waiting {
			return wireMsg{}, ctx.Err()
		}
		// The reader has taken the reply and is writing dest: dest must
		// not go back to its owner before it is done.
		select {
		case r := <-c.reply:
			return r, nil
		case <-l.down:
			return wireMsg{}, errLinkDown
		}
	}
}

// call passes m to the attached agent, waiting (up to s.wait) for one
// while none is, and asking the next one if the link ends first (reads
// and lookups may be repeated). A reply's data goes to dest.
func (s *holderServer) call(ctx context.Context, m wireMsg, dest []byte) (wireMsg, error) {
	deadline := time.Now().Add(s.wait)
	for {
		s.mu.Lock()
		l, changed := s.cur, s.changed
		s.mu.Unlock()
		if l != nil {
			r, err := l.call(ctx, m, dest)
			if !errors.Is(err, errLinkDown) {
				return r, err
			}
			continue
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return wireMsg{}, fmt.Errorf("no agent attached for %v", s.wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return wireMsg{}, ctx.Err()
		}
		t.Stop()
	}
}

func (s *holderServer) lookup(ctx context.Context, set string) (fileInfo, error) {
	r, err := s.call(ctx, wireMsg{Op: "lookup", Set: set}, nil)
	if err == nil && r.Err != "" {
		err = errors.New(r.Err)
		if r.NotExist {
			err = fmt.Errorf("%w: %s", os.ErrNotExist, r.Err)
		}
	}
	return r.Info, err
}

func (s *holderServer) read(ctx context.Context, set string, p []byte, off int64) (int, error) {
	r, err := s.call(ctx, wireMsg{Op: "read", Set: set, Off: off, Len: len(p)}, p)
	if err != nil {
		s.log.Error("read", "set", set, "offset", off, "err", err)
		return 0, err
	}
	n := r.N
	if r.Err != "" {
		s.log.Error("read", "set", set, "offset", off, "err", r.Err)
		return n, errors.New(r.Err)
	}
	return n, nil
}
