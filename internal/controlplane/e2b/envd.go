package e2b

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// defaultUser is who runs a sandbox's commands and owns its relative
// paths when a request names nobody: E2B's templates have a user "user"
// with home /home/user; a template without one gets root.
type defaultUser struct {
	name string // "root" or a user name
	home string
}

// Bounds of envd request bodies (serveEnvd); an upload's is the
// Backend's MaxUploadBytes.
const (
	// maxRPCMessage bounds a Connect RPC's request message, after
	// decompression (connect.WithReadMaxBytes and boundedGzip).
	maxRPCMessage = 1 << 20
	// maxOtherBody bounds the body of any other envd request (GET /files,
	// GET /health and unknown routes have none to read).
	maxOtherBody = 1 << 20
	// rpcFraming is what a Connect request may carry beyond its message:
	// a streaming request's 5-byte envelope prefix and end of stream.
	rpcFraming = 64 << 10
)

func (s *Server) envdRoutes() *http.ServeMux {
	m := http.NewServeMux()
	// The JSON codec; request messages of at most maxRPCMessage bytes,
	// compressed or not. Connect checks that limit on the decompressed
	// message too (it reads at most the limit + 1 bytes out of the
	// decompressor), but to say how large a message over it was, it then
	// decompresses the rest into io.Discard: a gzip bomb would cost a GiB
	// of inflating per MiB sent. boundedGzip stops there instead.
	opt := connect.WithHandlerOptions(connect.WithCodec(jsonCodec{}), connect.WithReadMaxBytes(maxRPCMessage),
		connect.WithCompression("gzip", func() connect.Decompressor { return &boundedGzip{} },
			func() connect.Compressor { return gzip.NewWriter(io.Discard) }))
	m.Handle("/process.Process/Start", connect.NewServerStreamHandler("/process.Process/Start", s.start, opt))
	m.Handle("/filesystem.Filesystem/Stat", connect.NewUnaryHandler("/filesystem.Filesystem/Stat", unary(s, s.stat), opt))
	m.Handle("/filesystem.Filesystem/ListDir", connect.NewUnaryHandler("/filesystem.Filesystem/ListDir", unary(s, s.listDir), opt))
	m.Handle("/filesystem.Filesystem/MakeDir", connect.NewUnaryHandler("/filesystem.Filesystem/MakeDir", unary(s, s.makeDir), opt))
	m.Handle("/filesystem.Filesystem/Remove", connect.NewUnaryHandler("/filesystem.Filesystem/Remove", unary(s, s.remove), opt))
	m.Handle("/filesystem.Filesystem/Move", connect.NewUnaryHandler("/filesystem.Filesystem/Move", unary(s, s.move), opt))
	m.Handle("/process.Process/Connect", connect.NewServerStreamHandler("/process.Process/Connect", s.connectProcess, opt))
	m.Handle("/process.Process/List", connect.NewUnaryHandler("/process.Process/List", unary(s, s.listProcesses), opt))
	m.Handle("/process.Process/SendInput", connect.NewUnaryHandler("/process.Process/SendInput", unary(s, s.sendInput), opt))
	m.Handle("/process.Process/SendSignal", connect.NewUnaryHandler("/process.Process/SendSignal", unary(s, s.sendSignal), opt))
	m.Handle("/process.Process/CloseStdin", connect.NewUnaryHandler("/process.Process/CloseStdin", unary(s, s.closeStdin), opt))
	m.Handle("/process.Process/Update", connect.NewUnaryHandler("/process.Process/Update", unary(s, s.update), opt))
	m.Handle("/filesystem.Filesystem/WatchDir", connect.NewServerStreamHandler("/filesystem.Filesystem/WatchDir", s.watchDir, opt))
	// Polling watchers (which the JS SDK does not use) and StreamInput
	// (which no SDK uses) answer unimplemented, as envd does for a method
	// it lacks.
	for _, p := range []string{"/filesystem.Filesystem/CreateWatcher",
		"/filesystem.Filesystem/GetWatcherEvents", "/filesystem.Filesystem/RemoveWatcher"} {
		m.Handle(p, connect.NewUnaryHandler(p, func(context.Context, *connect.Request[empty]) (*connect.Response[empty], error) {
			return nil, unimplemented(p)
		}, opt))
	}
	m.Handle("/process.Process/StreamInput", connect.NewClientStreamHandler("/process.Process/StreamInput",
		func(context.Context, *connect.ClientStream[empty]) (*connect.Response[empty], error) {
			return nil, unimplemented("/process.Process/StreamInput")
		}, opt))
	m.HandleFunc("GET /files", s.readFile)
	m.HandleFunc("POST /files", s.writeFiles)
	m.HandleFunc("GET /health", s.health)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, errStatus(http.StatusNotFound, "no such envd endpoint: %s %s", r.Method, r.URL.Path))
	})
	return m
}

func unimplemented(procedure string) error {
	return connect.NewError(connect.CodeUnimplemented, fmt.Errorf("%s is not implemented by PandaStack yet (StreamInput and polling watchers are not served)", procedure))
}

// envdTarget is the sandbox an envd request is for, and as whom.
type envdTarget struct {
	id   string
	g    host.Guest
	user defaultUser
}

// serveEnvd serves an envd request in an order that makes nobody who has
// not proved access to a sandbox cost the server a byte of body: it
// authenticates the request (the sandbox's X-Access-Token, or a file
// URL's signature) from its headers and URL alone, and answers a failure
// at once, unread (refuse); then it takes one of the sandbox's
// guest-request slots (the REST API's limits), caps the body
// (maxRPCMessage, the upload limit, maxOtherBody) and only then passes
// the request to its route, which reads the body. named is the sandbox
// the request is routed to: its E2b-Sandbox-Id header, or the sandbox of
// its host on the proxy domain; "" for a signed file URL that names none.
func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request, named string) {
	id, err := s.authenticate(r, named)
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	release, err := s.b.AcquireGuest(r.Context(), id)
	if err != nil {
		s.refuse(w, r, s.unreachable(id, err))
		return
	}
	defer release()
	limit, what := s.bodyLimit(r)
	if r.ContentLength > limit {
		s.refuse(w, r, tooLarge(r, "%s of %d bytes is over the limit of %d bytes", what, r.ContentLength, limit))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	s.envd.ServeHTTP(w, r.WithContext(signerContext(r.Context(), id)))
}

// authenticate returns the sandbox an envd request for sandbox id
// proved access to: id, if its access token is the request's
// X-Access-Token (compared in constant time), or, for a signed file URL,
// the one whose token signed it (id, if id is not "").
func (s *Server) authenticate(r *http.Request, id string) (string, error) {
	if signedFileURL(r) {
		return s.signer(r, id)
	}
	if !s.validToken(id, r.Header.Get("X-Access-Token")) {
		return "", errStatus(http.StatusUnauthorized, "missing or wrong X-Access-Token for sandbox %q", id)
	}
	return id, nil
}

// bodyLimit is the most r's body may hold, and what it is.
func (s *Server) bodyLimit(r *http.Request) (int64, string) {
	switch {
	case rpcRoute(r):
		return maxRPCMessage + rpcFraming, "a Connect request"
	case r.Method == http.MethodPost && r.URL.Path == "/files":
		return s.b.MaxUploadBytes(), "an upload"
	}
	return maxOtherBody, "a request body"
}

// rpcRoute reports whether r is for one of envd's Connect services.
func rpcRoute(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/process.Process/") || strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/")
}

// tooLarge is the error of a body over its limit: resource_exhausted for
// a Connect RPC (what connect says of a message over WithReadMaxBytes),
// else 413.
func tooLarge(r *http.Request, format string, args ...any) error {
	if rpcRoute(r) {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(format, args...))
	}
	return errStatus(http.StatusRequestEntityTooLarge, format, args...)
}

// refuse answers err to an envd request whose body has not been read and
// will not be: in the shape of a Connect error for an RPC (connect's
// ErrorWriter, which reads nothing), else E2B's JSON. What net/http does
// with the unread body is bounded: it reads at most 256 KiB of it into
// nothing to keep the connection, else closes the connection after the
// answer. (Closing it at once, with Connection: close, would reset it
// under a client still sending, and lose the answer.)
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if rpcRoute(r) {
		s.errs.Write(w, r, s.rpcError(err))
		return
	}
	s.writeError(w, r, err)
}

// target reaches the sandbox an envd request proved access to
// (serveEnvd). user is the user the request names (Basic auth, or the
// username query of /files); "" is the sandbox's default.
func (s *Server) target(ctx context.Context, h http.Header, user string) (envdTarget, error) {
	id, ok := ctx.Value(sandboxKey{}).(string)
	if !ok {
		// Not reached: serveEnvd authenticates every envd request.
		return envdTarget{}, errStatus(http.StatusUnauthorized, "the request did not prove access to a sandbox")
	}
	g, err := s.b.Guest(ctx, id)
	if err != nil {
		return envdTarget{}, s.unreachable(id, err)
	}
	t := envdTarget{id: id, g: g}
	if user == "" {
		user = basicUser(h.Get("Authorization"))
	}
	switch user {
	case "":
		t.user = s.defaultUser(ctx, id, g)
	case "root":
		t.user = defaultUser{name: "root", home: "/root"}
	default:
		if err := guestproto.ValidateUser(user); err != nil {
			return envdTarget{}, errStatus(http.StatusBadRequest, "user %q: %v", user, err)
		}
		t.user = defaultUser{name: user, home: "/home/" + user}
	}
	return t, nil
}

// unreachable is the error of a request for sandbox id that err (the
// Backend's) keeps from it: E2B's proxy answers 502 for a sandbox that is
// not running, which the SDK reads as the sandbox having timed out.
func (s *Server) unreachable(id string, err error) error {
	st, msg := s.status(err)
	if st == http.StatusNotFound || st == http.StatusConflict {
		return errStatus(http.StatusBadGateway, "sandbox %q is not running (killed or timed out)", id)
	}
	return errStatus(st, "%s", msg)
}

// basicUser is the user of an "Authorization: Basic base64(user:)" header.
func basicUser(h string) string {
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return ""
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u
}

// defaultUser finds (once per sandbox) whether its template has E2B's
// user "user": a /home/user directory.
func (s *Server) defaultUser(ctx context.Context, id string, g host.Guest) defaultUser {
	s.mu.Lock()
	u, ok := s.users[id]
	s.mu.Unlock()
	if ok {
		return u
	}
	u = defaultUser{name: "root", home: "/root"}
	fi, err := g.Stat(ctx, "/home/user")
	if err == nil && fi.IsDir {
		u = defaultUser{name: "user", home: "/home/user"}
	} else if err != nil && guestproto.CodeOf(err) != guestproto.CodeNotFound {
		return u // not known yet: ask again next time
	}
	s.mu.Lock()
	if len(s.users) > 10000 {
		clear(s.users) // killed sandboxes' entries: bounded, not tracked
	}
	s.users[id] = u
	s.mu.Unlock()
	return u
}

// resolve makes p absolute: relative paths and ~ are under the user's home.
func (t envdTarget) resolve(p string) (string, error) {
	switch {
	case p == "~" || p == "":
		p = t.user.home
	case strings.HasPrefix(p, "~/"):
		p = t.user.home + p[1:]
	case !path.IsAbs(p):
		p = t.user.home + "/" + p
	}
	if strings.ContainsRune(p, 0) || len(p) > 4096 {
		return "", errStatus(http.StatusBadRequest, "invalid path %q", p)
	}
	return path.Clean(p), nil
}

// chown gives what a user other than root created to that user (the
// guest agent creates files as root), as envd does.
func (t envdTarget) chown(ctx context.Context, p string) error {
	if t.user.name == "root" {
		return nil
	}
	return run(ctx, t.g, []string{"chown", t.user.name + ":", p})
}

// run runs argv as root and fails unless it exits 0.
func run(ctx context.Context, g host.Guest, argv []string) error {
	p, err := g.StartExec(ctx, guestproto.ExecRequest{Argv: argv, TimeoutMS: 30000})
	if err != nil {
		return err
	}
	var stderr strings.Builder
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); io.Copy(io.Discard, p.Stdout()) }()
	io.Copy(&stderr, io.LimitReader(p.Stderr(), 4096))
	io.Copy(io.Discard, p.Stderr())
	wg.Wait()
	res, err := p.Wait()
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%s: exit %d: %s", argv[0], res.ExitCode, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// unary adapts a unary envd RPC on the request's sandbox: it
// authenticates the request and reaches the sandbox (target) for fn, and
// turns fn's errors into connect errors (rpcError: a *connect.Error passes
// as it is).
func unary[Req, Res any](s *Server, fn func(ctx context.Context, t envdTarget, m *Req) (*Res, error)) func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error) {
	return func(ctx context.Context, req *connect.Request[Req]) (*connect.Response[Res], error) {
		t, err := s.target(ctx, req.Header(), "")
		if err != nil {
			return nil, s.rpcError(err)
		}
		res, err := fn(ctx, t, req.Msg)
		if err != nil {
			return nil, s.rpcError(err)
		}
		return connect.NewResponse(res), nil
	}
}

// rpcError turns err into a connect error with the code E2B's envd uses.
func (s *Server) rpcError(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	st, msg := s.status(err)
	code := connect.CodeInternal
	switch st {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		code = connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		code = connect.CodeUnauthenticated
	case http.StatusForbidden:
		code = connect.CodePermissionDenied
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeFailedPrecondition
	case http.StatusTooManyRequests, http.StatusInsufficientStorage:
		code = connect.CodeResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		code = connect.CodeUnavailable
	case http.StatusGatewayTimeout:
		code = connect.CodeDeadlineExceeded
	case http.StatusNotImplemented:
		code = connect.CodeUnimplemented
	case 499:
		code = connect.CodeCanceled
	}
	return connect.NewError(code, errors.New(msg))
}

// keepaliveEvery is how often a quiet command's stream carries a
// keepalive event (the SDK asks for one at least every 50 s).
const keepaliveEvery = 30 * time.Second

// start runs a command and streams its events: start, data…, end. On a
// host.ProcessGuest it is a background process (see startProcess); otherwise
// the command dies if the client goes away or Connect-Timeout-Ms passes.
func (s *Server) start(ctx context.Context, req *connect.Request[startRequest], stream *connect.ServerStream[startResponse]) error {
	t, err := s.target(ctx, req.Header(), "")
	if err != nil {
		return s.rpcError(err)
	}
	m := req.Msg
	if m.Process.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	cwd := t.user.home
	if m.Process.Cwd != nil && *m.Process.Cwd != "" {
		if cwd, err = t.resolve(*m.Process.Cwd); err != nil {
			return s.rpcError(err)
		}
	}
	user := t.user.name
	if user == "root" {
		user = ""
	}
	env := map[string]string{}
	if t.user.name != "root" {
		env["HOME"], env["USER"] = t.user.home, t.user.name
	}
	for k, v := range m.Process.Envs {
		env[k] = v
	}
	g := guestproto.ExecRequest{Argv: append([]string{m.Process.Cmd}, m.Process.Args...), Env: env, Cwd: cwd, User: user}
	if m.PTY != nil {
		g.PTY = &guestproto.PTYSize{Rows: int(m.PTY.Size.Rows), Cols: int(m.PTY.Size.Cols)}
	}
	if err := g.Validate(); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if pg, ok := t.g.(host.ProcessGuest); ok {
		return s.startProcess(ctx, t, pg, m, g, stream)
	}
	if m.PTY != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("a PTY is not served for this sandbox: its host does not keep background processes"))
	}
	if m.Stdin != nil && *m.Stdin {
		return connect.NewError(connect.CodeUnimplemented, errors.New("stdin is not served for this sandbox: its host does not keep background processes"))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p, err := t.g.StartExec(ctx, g)
	if err != nil {
		return s.rpcError(err)
	}
	send := lockedSend(func(ev processEvent) error { return stream.Send(&startResponse{Event: ev}) })
	if err := send(processEvent{Start: &startEvent{PID: uint32(p.PID())}}); err != nil {
		cancel()
	}
	stop := keepalive(func() { send(processEvent{Keepalive: &struct{}{}}) })
	pumpData(send, p.Stdout(), p.Stderr(), false, cancel) // client gone: kill the command
	stop()
	res, err := p.Wait()
	if ctx.Err() != nil {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command timed out"))
		}
		return connect.NewError(connect.CodeCanceled, errors.New("the command was canceled"))
	}
	if err != nil {
		return s.rpcError(err)
	}
	return send(processEvent{End: endOf(res)})
}

// entry converts a guest's file info.
func entry(fi guestproto.FileInfo) entryInfo {
	e := entryInfo{Name: fi.Name, Type: fileTypeFile, Path: fi.Path, Size: fi.Size, Mode: fi.Mode & 0o7777,
		Permissions: fi.FileMode().Perm().String()}
	mode := fi.FileMode()
	switch {
	case fi.IsSymlink:
		e.Type = fileTypeSymlink
		target := fi.LinkTarget
		e.SymlinkTarget = &target
		mode |= fs.ModeSymlink
	case fi.IsDir:
		e.Type = fileTypeDirectory
		mode |= fs.ModeDir
		e.Mode |= uint32(fs.ModeDir)
	}
	e.Permissions = mode.String()
	if fi.MtimeUnixNano != 0 {
		e.ModifiedTime = time.Unix(0, fi.MtimeUnixNano).UTC().Format(time.RFC3339Nano)
	}
	if e.Name == "" {
		e.Name = path.Base(fi.Path)
	}
	return e
}

// statEntry is the entry of path p.
func statEntry(ctx context.Context, t envdTarget, p string) (*entryResponse, error) {
	fi, err := t.g.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	if fi.Path == "" {
		fi.Path = p
	}
	return &entryResponse{Entry: entry(fi)}, nil
}

func (s *Server) stat(ctx context.Context, t envdTarget, m *pathRequest) (*entryResponse, error) {
	p, err := t.resolve(m.Path)
	if err != nil {
		return nil, err
	}
	return statEntry(ctx, t, p)
}

// A recursive ListDir reads at most maxListEntries entries and
// maxListBytes bytes of them (listingSize), counted as each directory's
// listing arrives: the answer is a part of them, and so are the listings
// of the directories it is inside of, which the walk holds while it lists
// their subdirectories. Each directory's listing is bounded by the guest
// protocol (guestproto.ClientConfig.MaxListEntries, MaxListBytes); these
// bound the sum over a tree, whose names and paths come from the guest
// and may each be kilobytes long.
const (
	maxListEntries = 100000
	maxListBytes   = 16 << 20
)

// listingSize is what a directory's listing costs: its strings, and a
// fixed part per entry for the rest of it and of its JSON.
func listingSize(list []guestproto.FileInfo) int {
	n := 0
	for _, fi := range list {
		n += len(fi.Name) + len(fi.Path) + len(fi.LinkTarget) + 200
	}
	return n
}

func (s *Server) listDir(ctx context.Context, t envdTarget, m *listDirRequest) (*listDirResponse, error) {
	p, err := t.resolve(m.Path)
	if err != nil {
		return nil, err
	}
	depth := int(m.Depth)
	if depth < 1 {
		depth = 1
	}
	out := &listDirResponse{Entries: []entryInfo{}}
	entries, size := 0, 0
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		list, err := t.g.ListDir(ctx, dir)
		if err != nil {
			return err
		}
		if entries += len(list); entries > maxListEntries {
			return errStatus(http.StatusBadRequest, "the listing of %s has more than %d entries: list with a smaller depth or a subdirectory", p, maxListEntries)
		}
		if size += listingSize(list); size > maxListBytes {
			return errStatus(http.StatusBadRequest, "the listing of %s is larger than %d MiB: list with a smaller depth or a subdirectory", p, maxListBytes>>20)
		}
		for _, fi := range list {
			if fi.Path == "" {
				fi.Path = path.Join(dir, fi.Name)
			}
			out.Entries = append(out.Entries, entry(fi))
			if fi.IsDir && !fi.IsSymlink && level < depth {
				if err := walk(fi.Path, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		return nil, err
	}
	return out, nil
}

func (s *Server) makeDir(ctx context.Context, t envdTarget, m *pathRequest) (*entryResponse, error) {
	p, err := t.resolve(m.Path)
	if err != nil {
		return nil, err
	}
	if _, err := t.g.Stat(ctx, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("%s already exists", p))
	}
	if err := t.g.Mkdir(ctx, p); err != nil {
		return nil, err
	}
	if err := t.chown(ctx, p); err != nil {
		return nil, err
	}
	return statEntry(ctx, t, p)
}

func (s *Server) remove(ctx context.Context, t envdTarget, m *pathRequest) (*empty, error) {
	p, err := t.resolve(m.Path)
	if err != nil {
		return nil, err
	}
	if err := t.g.Remove(ctx, p, true); err != nil {
		return nil, err
	}
	return &empty{}, nil
}

func (s *Server) move(ctx context.Context, t envdTarget, m *moveRequest) (*entryResponse, error) {
	src, err := t.resolve(m.Source)
	if err != nil {
		return nil, err
	}
	dst, err := t.resolve(m.Destination)
	if err != nil {
		return nil, err
	}
	if err := t.g.Rename(ctx, src, dst); err != nil {
		return nil, err
	}
	return statEntry(ctx, t, dst)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if _, err := s.target(r.Context(), r.Header, ""); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readFile answers GET /files?path=&username=: the file's bytes.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	t, err := s.target(r.Context(), r.Header, r.URL.Query().Get("username"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p, err := t.resolve(r.URL.Query().Get("path"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, fi, err := t.g.ReadFile(r.Context(), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		panic(http.ErrAbortHandler) // a short body, not a silently short file
	}
}

type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// writeFiles answers POST /files: multipart/form-data with a part "file"
// per file (its filename the full path; ?path= names a single file), or
// application/octet-stream (optionally gzip) to ?path=.
func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	t, err := s.target(r.Context(), r.Header, q.Get("username"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var out []writeInfo
	write := func(name string, body io.Reader) error {
		p, err := t.resolve(name)
		if err != nil {
			return err
		}
		if _, err := t.g.WriteFile(r.Context(), p, body, 0o644); err != nil {
			return err
		}
		if err := t.chown(r.Context(), p); err != nil {
			return err
		}
		out = append(out, writeInfo{Name: path.Base(p), Type: "file", Path: p})
		return nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "multipart/form-data":
		mr, err := r.MultipartReader()
		if err != nil {
			s.writeError(w, r, errStatus(http.StatusBadRequest, "invalid multipart body: %v", err))
			return
		}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				s.writeError(w, r, errStatus(http.StatusBadRequest, "invalid multipart body: %v", err))
				return
			}
			if part.FormName() != "file" {
				continue
			}
			// Part.FileName keeps only the base name: the SDK sends the
			// full path there.
			_, params, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			name := params["filename"]
			if qp := q.Get("path"); qp != "" && len(out) == 0 {
				name = qp
			}
			if name == "" {
				s.writeError(w, r, errStatus(http.StatusBadRequest, "a file part without a path (filename or ?path=)"))
				return
			}
			if err := write(name, part); err != nil {
				s.writeError(w, r, err)
				return
			}
		}
	case "application/octet-stream", "":
		if q.Get("path") == "" {
			s.writeError(w, r, errStatus(http.StatusBadRequest, "path is required for an octet-stream upload"))
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				s.writeError(w, r, errStatus(http.StatusBadRequest, "invalid gzip body: %v", err))
				return
			}
			// The body's size is capped (serveEnvd); so is what it
			// inflates to.
			max := s.b.MaxUploadBytes()
			body = &cappedReader{r: zr, left: max + 1, err: errStatus(http.StatusRequestEntityTooLarge, "the upload is larger than %d bytes once decompressed", max)}
		}
		if err := write(q.Get("path"), body); err != nil {
			s.writeError(w, r, err)
			return
		}
	default:
		s.writeError(w, r, errStatus(http.StatusBadRequest, "unsupported Content-Type %q: send multipart/form-data or application/octet-stream", ct))
		return
	}
	if len(out) == 0 {
		s.writeError(w, r, errStatus(http.StatusBadRequest, "no file in the request"))
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// cappedReader reads r until left bytes have been read, then fails with
// err (where io.LimitReader's EOF would pass a cut stream for a whole one).
type cappedReader struct {
	r    io.Reader
	left int64
	err  error
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, c.err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// boundedGzip is connect's gzip decompressor producing at most
// maxRPCMessage + 1 bytes: enough for connect to see that a message is
// over WithReadMaxBytes, after which it fails instead of inflating the
// rest of the message for connect to measure it.
type boundedGzip struct {
	zr gzip.Reader
	cappedReader
}

func (z *boundedGzip) Reset(r io.Reader) error {
	z.cappedReader = cappedReader{r: &z.zr, left: maxRPCMessage + 1,
		err: fmt.Errorf("the message is larger than %d bytes once decompressed", maxRPCMessage)}
	return z.zr.Reset(r)
}

func (z *boundedGzip) Close() error { return z.zr.Close() }
