package guestproto

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"time"
)

// HelloRequest is the JSON payload of HELLO, the first frame a host sends on a
// new connection. It starts a new session and carries what the agent's restore
// hooks need.
type HelloRequest struct {
	// Session identifies the session; a HELLO whose session equals the current
	// one is answered again without resetting anything (a retransmission).
	Session string `json:"session"`
	// TimeUnixNano is the host's wall clock; the agent sets the guest clock to it.
	TimeUnixNano int64 `json:"time_unix_nano"`
	// Entropy is mixed into the guest kernel RNG, which is then reseeded
	// (base64 in JSON; at least 64 bytes).
	Entropy []byte `json:"entropy"`
	// Hostname, when set, becomes the guest hostname and /etc/hostname.
	Hostname string `json:"hostname,omitempty"`
	// MachineID, when set (32 lowercase hex digits), becomes /etc/machine-id.
	MachineID string `json:"machine_id,omitempty"`
	// SandboxID is informational.
	SandboxID string `json:"sandbox_id,omitempty"`
	// Env is the default environment of execs in this session; an exec's own
	// env is merged over it.
	Env map[string]string `json:"env,omitempty"`
}

// MinEntropy is the least number of entropy bytes a HELLO must carry.
const MinEntropy = 64

// Validate reports whether r is a well-formed HELLO.
func (r *HelloRequest) Validate() error {
	switch {
	case r.Session == "" || len(r.Session) > 128:
		return errors.New("session must be 1 to 128 bytes")
	case len(r.Entropy) < MinEntropy || len(r.Entropy) > 4096:
		return fmt.Errorf("entropy must be %d to 4096 bytes, got %d", MinEntropy, len(r.Entropy))
	case r.MachineID != "" && !validMachineID(r.MachineID):
		return fmt.Errorf("machine_id %q is not 32 lowercase hex digits", r.MachineID)
	case len(r.Hostname) > 64 || strings.ContainsAny(r.Hostname, "/\x00 \n"):
		return fmt.Errorf("hostname %q is not a valid host name", r.Hostname)
	}
	return nil
}

func validMachineID(s string) bool {
	if len(s) != 32 || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// HelloReply is the JSON payload of HELLO_ACK.
type HelloReply struct {
	Session      string `json:"session"`
	AgentVersion string `json:"agent_version"`
	// BootID is the guest kernel's boot id; every restore of one snapshot
	// reports the same value.
	BootID   string `json:"boot_id,omitempty"`
	PID1     bool   `json:"pid1"`
	UptimeMS int64  `json:"uptime_ms"`
	// HookErrors lists the restore hooks that failed, one message each. The
	// session is usable regardless.
	HookErrors []string `json:"hook_errors,omitempty"`
	// Features lists the optional abilities of the agent (FeatureExecUser).
	// An agent older than a feature does not list it, and ignores the
	// request fields that use it.
	Features []string `json:"features,omitempty"`
	// Error is set when the HELLO was rejected; no session started.
	Error *Error `json:"error,omitempty"`
}

// FeatureExecUser: the agent runs an exec as ExecRequest.User.
const FeatureExecUser = "exec_user"

// HasFeature reports whether the agent listed feature f.
func (r *HelloReply) HasFeature(f string) bool {
	for _, x := range r.Features {
		if x == f {
			return true
		}
	}
	return false
}

// Op names the operation a stream performs.
type Op string

// Stream operations.
const (
	OpExec      Op = "exec"
	OpReadFile  Op = "read_file"
	OpWriteFile Op = "write_file"
	OpListDir   Op = "list_dir"
	OpStat      Op = "stat"
	OpMkdir     Op = "mkdir"
	OpRemove    Op = "remove"
	OpRename    Op = "rename"
)

// OpenRequest is the JSON payload of OPEN.
type OpenRequest struct {
	Op   Op           `json:"op"`
	Exec *ExecRequest `json:"exec,omitempty"`
	// Path is the absolute guest path of a file operation.
	Path string `json:"path,omitempty"`
	// NewPath is the destination of a rename.
	NewPath string `json:"new_path,omitempty"`
	// Mode holds the permission bits of write_file and mkdir (0 = default).
	Mode uint32 `json:"mode,omitempty"`
	// Recursive makes remove delete a directory tree.
	Recursive bool `json:"recursive,omitempty"`
	// Proc names a background process for the proc_* operations.
	Proc *ProcRequest `json:"proc,omitempty"`
	// Port is the TCP port on the guest's loopback a dial connects to.
	Port int `json:"port,omitempty"`
	// Volumes are the volume mounts of OpVolumes (see Client.OpenVolumes).
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// ExecRequest describes a process to run in the guest.
type ExecRequest struct {
	// Argv is the command and its arguments; argv[0] is looked up in PATH.
	Argv []string `json:"argv,omitempty"`
	// Shell, when set instead of Argv, is run as /bin/bash -c Shell when
	// the guest has /bin/bash, else as /bin/sh -c Shell.
	Shell string `json:"shell,omitempty"`
	// Env is merged over the session's default env and the agent's own.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is the working directory (absolute); default $HOME or /.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutMS, when positive, kills the process group with SIGKILL after
	// that many milliseconds.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Stdin connects the process's stdin to the stream; otherwise it reads
	// /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// User runs the process as a user instead of root, written as Docker's
	// USER: "name", "uid", "name:group" or "uid:gid" (see ValidateUser).
	// The guest resolves names in its own /etc/passwd and /etc/group.
	// Only agents that list FeatureExecUser honour it.
	User string `json:"user,omitempty"`
	// PTY, for proc_start only, runs the process on a new pseudo-terminal
	// of that size (its stdin, stdout and stderr, and its controlling
	// terminal, in a new session) instead of pipes: its output is the
	// terminal's, read as stdout; stdin writes are keystrokes. TERM
	// defaults to xterm-256color. Only agents that list FeaturePTY
	// honour it.
	PTY *PTYSize `json:"pty,omitempty"`
}

// PTYSize is a terminal's size in characters.
type PTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// MaxPTYSize bounds PTYSize's Rows and Cols.
const MaxPTYSize = 1000

// Validate reports whether z is a size a terminal may have: rows and
// cols each from 1 to MaxPTYSize.
func (z PTYSize) Validate() error {
	if z.Rows < 1 || z.Rows > MaxPTYSize || z.Cols < 1 || z.Cols > MaxPTYSize {
		return fmt.Errorf("terminal size %dx%d: rows and cols must be 1 to %d", z.Rows, z.Cols, MaxPTYSize)
	}
	return nil
}

// MaxUserLen bounds ExecRequest.User.
const MaxUserLen = 256

// ValidateUser reports whether u is a well-formed user spec: "user" or
// "user:group", each part a name of letters, digits, '.', '_' and '-' (not
// starting with '-'; a trailing '$' is allowed, as for machine accounts) or
// a decimal id below 2^32-1. "" (the default user) is valid.
func ValidateUser(u string) error {
	if u == "" {
		return nil
	}
	if len(u) > MaxUserLen {
		return fmt.Errorf("user is longer than %d bytes", MaxUserLen)
	}
	name, group, hasGroup := strings.Cut(u, ":")
	if err := validateUserPart("user", name); err != nil {
		return err
	}
	if hasGroup {
		return validateUserPart("group", group)
	}
	return nil
}

func validateUserPart(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty in user spec", what)
	}
	if isDigits(s) {
		if _, ok := ParseID(s); !ok {
			return fmt.Errorf("%s id %s is out of range", what, s)
		}
		return nil
	}
	if s[0] == '-' {
		return fmt.Errorf("%s %q starts with '-'", what, s)
	}
	for i, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		case c == '$' && i == len(s)-1:
		default:
			return fmt.Errorf("%s %q contains %q: names may hold letters, digits, '.', '_' and '-'", what, s, rune(c))
		}
	}
	return nil
}

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// ParseID parses a decimal user or group id; ids are below 2^32-1, which
// means "no id" to the kernel.
func ParseID(s string) (uint32, bool) {
	if !isDigits(s) || len(s) > 10 {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n == 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// Validate reports whether r can be run.
func (r *ExecRequest) Validate() error {
	switch {
	case len(r.Argv) == 0 && r.Shell == "":
		return errors.New("exec needs argv or shell")
	case len(r.Argv) > 0 && r.Shell != "":
		return errors.New("exec takes argv or shell, not both")
	case len(r.Argv) > 0 && r.Argv[0] == "":
		return errors.New("argv[0] is empty")
	case r.Cwd != "" && !path.IsAbs(r.Cwd):
		return fmt.Errorf("cwd %q is not absolute", r.Cwd)
	case r.TimeoutMS < 0:
		return errors.New("timeout_ms is negative")
	}
	if err := ValidateUser(r.User); err != nil {
		return err
	}
	if r.PTY != nil {
		if err := r.PTY.Validate(); err != nil {
			return err
		}
	}
	for _, a := range r.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("argv contains a NUL byte")
		}
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("invalid env entry %q", k)
		}
	}
	return nil
}

// ExecResult is how a process ended.
type ExecResult struct {
	// ExitCode is the exit status, or 128+signal number when killed by a signal.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the process ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// TimedOut reports that the agent killed the process group at timeout_ms.
	TimedOut   bool  `json:"timed_out,omitempty"`
	DurationMS int64 `json:"duration_ms"`
}

// FileInfo describes a guest file as lstat(2) sees it.
type FileInfo struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Mode holds the Unix permission bits including setuid, setgid and sticky
	// (st_mode & 07777).
	Mode          uint32 `json:"mode"`
	IsDir         bool   `json:"is_dir"`
	IsSymlink     bool   `json:"is_symlink"`
	LinkTarget    string `json:"link_target,omitempty"`
	MtimeUnixNano int64  `json:"mtime_unix_nano"`
}

// FileMode returns the mode as an fs.FileMode.
func (fi FileInfo) FileMode() fs.FileMode {
	m := fs.FileMode(fi.Mode & 0o777)
	if fi.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if fi.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if fi.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch {
	case fi.IsDir:
		m |= fs.ModeDir
	case fi.IsSymlink:
		m |= fs.ModeSymlink
	}
	return m
}

// ModTime returns the modification time.
func (fi FileInfo) ModTime() time.Time { return time.Unix(0, fi.MtimeUnixNano) }

// Reply is the JSON payload of REPLY (the guest's first frame on a stream) and
// of EXIT (its final result). Error is set exactly when the operation failed.
type Reply struct {
	Error *Error `json:"error,omitempty"`
	// PID is the exec's process id (REPLY of exec).
	PID int `json:"pid,omitempty"`
	// Info describes the file (REPLY of read_file and stat).
	Info *FileInfo `json:"info,omitempty"`
	// Exec is how the process ended (EXIT of exec).
	Exec *ExecResult `json:"exec,omitempty"`
	// Written is the number of bytes stored (EXIT of write_file).
	Written int64 `json:"written,omitempty"`
	// Proc describes a background process (proc_start, proc_attach,
	// proc_wait).
	Proc *ProcInfo `json:"proc,omitempty"`
	// Attach is where a proc_attach's output starts (its REPLY).
	Attach *AttachStart `json:"attach,omitempty"`
	// Lagged ends a proc_attach that fell behind the output ring buffer
	// (its EXIT, without Proc.Exit); attach again.
	Lagged bool `json:"lagged,omitempty"`
}

// ValidPath reports an *Error with CodeInvalid unless p is an absolute path
// without NUL bytes.
func ValidPath(p string) error {
	switch {
	case p == "":
		return Errorf(CodeInvalid, "path is empty")
	case strings.IndexByte(p, 0) >= 0:
		return Errorf(CodeInvalid, "path contains a NUL byte")
	case !path.IsAbs(p):
		return Errorf(CodeInvalid, "path %q is not absolute", p)
	}
	return nil
}
