// Package guest is the guest agent that runs inside every sandbox VM (as PID 1
// in production): it serves the guestproto protocol with process execution,
// file operations and the restore hooks that make each restored or forked
// copy of a snapshot unique (clock, kernel RNG, hostname, machine-id), and, as
// PID 1, it sets up the system and reaps orphans.
//
// It depends on the standard library, golang.org/x/sys and guestproto only;
// it must never import host code.
package guest

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// Config configures a Server.
type Config struct {
	// Hooks run on every HELLO. Required: production uses SystemHooks, tests
	// a fake, so a test never changes the host's clock or hostname.
	Hooks Hooks
	// Reaper starts and reaps every exec. Required; its Run must be running.
	Reaper *Reaper
	// Logger receives errors; nil discards.
	Logger *slog.Logger
	// Version is reported in HELLO_ACK.
	Version string
	// PID1 is reported in HELLO_ACK.
	PID1 bool
	// Env is the base environment of execs ("K=V"); nil means os.Environ().
	Env []string
	// Root is the directory whose etc/passwd and etc/group name the users
	// execs run as; "" means "/". (Tests point it at a made-up root.)
	Root string
	// Bash is the bash that runs commands given as a string when it
	// exists (else /bin/sh does); "" means DefaultBash. (Tests point it
	// at a missing path to act as a guest without bash.)
	Bash string
	// LoginEnvFile is where the agent writes the script that login
	// shells read after their profiles to put back the explicit
	// variables; "" means DefaultLoginEnvFile. (Tests use a temp dir.)
	LoginEnvFile string
	// ExitGrace is how long an exec's output is still streamed after its
	// process exited, for children that hold its pipes; then the pipes are
	// closed. Zero means one second.
	ExitGrace time.Duration
}

// SandboxIDEnv is the environment variable that tells commands their
// sandbox's id.
const SandboxIDEnv = "PANDA_SANDBOX_ID"

// Server implements guestproto.Handler.
type Server struct {
	hooks  Hooks
	reaper *Reaper
	log    *slog.Logger
	cfg    Config
	start  time.Time
	base   map[string]string
	// bootID is read once: it never changes for a guest kernel, and every
	// restored copy of a snapshot shares it. Reading /proc on each HELLO
	// would cost procfs code paths freshly translated after each restore.
	bootID string

	shell shell

	mu         sync.Mutex
	sessionEnv map[string]string

	procs procTable
	// dials counts the dial streams being served (at most
	// guestproto.MaxGuestDials).
	dials atomic.Int64
	// vols holds the volume mounts (OpVolumes).
	vols volManager
}

var _ guestproto.Handler = (*Server)(nil)

// NewServer returns a server; it starts nothing.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.ExitGrace == 0 {
		cfg.ExitGrace = time.Second
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Bash == "" {
		cfg.Bash = DefaultBash
	}
	if cfg.LoginEnvFile == "" {
		cfg.LoginEnvFile = DefaultLoginEnvFile
	}
	base := make(map[string]string, len(cfg.Env))
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			base[k] = v
		}
	}
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return &Server{
		procs:  procTable{procs: make(map[int]*bgProc)},
		bootID: strings.TrimSpace(string(bootID)),
		hooks:  cfg.Hooks,
		reaper: cfg.Reaper,
		log:    cfg.Logger,
		cfg:    cfg,
		start:  time.Now(),
		base:   base,
		shell:  shell{bash: cfg.Bash, loginEnv: cfg.LoginEnvFile},
	}
}

// Hello runs the restore hooks in order (clock first, so later timestamps
// are right) and adopts the session's default env. A failed hook is logged
// and reported in HookErrors; the session starts regardless.
func (s *Server) Hello(ctx context.Context, req *guestproto.HelloRequest) guestproto.HelloReply {
	var errs []string
	run := func(name string, err error) {
		if err != nil {
			s.log.Error("restore hook failed", "hook", name, "err", err)
			errs = append(errs, name+": "+err.Error())
		}
	}
	if req.TimeUnixNano != 0 {
		run("clock", s.hooks.SetClock(time.Unix(0, req.TimeUnixNano)))
	}
	run("entropy", s.hooks.AddEntropy(req.Entropy))
	if req.Hostname != "" {
		run("hostname", s.hooks.SetHostname(req.Hostname))
	}
	if req.MachineID != "" {
		run("machine_id", s.hooks.SetMachineID(req.MachineID))
	}
	env := maps.Clone(req.Env)
	if req.SandboxID != "" {
		// Every command can tell which sandbox it runs in, also in a fork's
		// children, whose memory says otherwise.
		if env == nil {
			env = map[string]string{}
		}
		if _, set := env[SandboxIDEnv]; !set {
			env[SandboxIDEnv] = req.SandboxID
		}
	}
	s.mu.Lock()
	s.sessionEnv = env
	s.mu.Unlock()

	return guestproto.HelloReply{
		AgentVersion: s.cfg.Version,
		BootID:       s.bootID,
		PID1:         s.cfg.PID1,
		UptimeMS:     time.Since(s.start).Milliseconds(),
		HookErrors:   errs,
		Features:     []string{guestproto.FeatureExecUser, guestproto.FeatureWatchDir, guestproto.FeatureProcesses, guestproto.FeaturePTY, guestproto.FeatureDial, guestproto.FeatureVolumes},
	}
}

// ServeStream dispatches one stream by operation.
func (s *Server) ServeStream(ctx context.Context, st *guestproto.Stream, req *guestproto.OpenRequest) {
	switch req.Op {
	case guestproto.OpExec:
		s.exec(ctx, st, req.Exec)
	case guestproto.OpReadFile:
		s.readFile(st, req)
	case guestproto.OpWriteFile:
		s.writeFile(st, req)
	case guestproto.OpListDir:
		s.listDir(st, req)
	case guestproto.OpStat:
		s.stat(st, req)
	case guestproto.OpMkdir:
		s.mkdir(st, req)
	case guestproto.OpRemove:
		s.remove(st, req)
	case guestproto.OpRename:
		s.rename(st, req)
	case guestproto.OpWatchDir:
		s.watchDir(ctx, st, req)
	case guestproto.OpProcStart:
		s.procStart(ctx, st, req.Exec)
	case guestproto.OpProcList:
		s.procList(st)
	case guestproto.OpProcAttach, guestproto.OpProcStdin, guestproto.OpProcSignal, guestproto.OpProcWait, guestproto.OpProcRemove, guestproto.OpProcResize:
		s.procOp(ctx, st, req.Op, req.Proc)
	case guestproto.OpDial:
		s.dial(ctx, st, req)
	case guestproto.OpVolumes:
		s.volumes(ctx, st, req)
	default:
		_ = st.Reply(guestproto.Reply{Error: guestproto.Errorf(guestproto.CodeInvalid, "unknown op %q", req.Op)})
	}
}

// execEnv merges, later winning, the base env, user (the exec user's
// HOME, USER and LOGNAME; an empty value unsets the base's), the session's
// default env and the request's. explicit is the part set by the session
// (template, sandbox) and the request, which login profiles must not
// overwrite (shell.keepExplicit).
func (s *Server) execEnv(user, req map[string]string) (env, explicit map[string]string) {
	s.mu.Lock()
	session := s.sessionEnv
	s.mu.Unlock()
	env = maps.Clone(s.base)
	for k, v := range user {
		if v == "" {
			delete(env, k)
		} else {
			env[k] = v
		}
	}
	explicit = make(map[string]string, len(session)+len(req))
	maps.Copy(explicit, session)
	maps.Copy(explicit, req)
	maps.Copy(env, explicit)
	return env, explicit
}

// replyErr sends a failed REPLY.
func replyErr(st *guestproto.Stream, err error) {
	_ = st.Reply(guestproto.Reply{Error: toProtoError(err)})
}
