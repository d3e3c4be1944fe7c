// Package templates is the vocabulary of templates that the control plane
// and the hosts share: a template's reference ("NAME", "NAME:N") and name
// rules, the parameters that select a baked template (Params) and what a
// baked one is (Meta), a user template's versions (UserRootFS) with what
// their image says (ImageConfig) and what their bake starts (Startup),
// and the error classes of templates. Baking and keeping templates is a
// host's (internal/hostagent/template). Standard library only.
package templates

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/accel"
)

// Params selects a template: the root filesystem name and the machine
// shape, which a restore cannot change.
type Params struct {
	Name      string `json:"name"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ValidName reports whether name can name a template: 1-32 lowercase
// letters, digits, - or _, starting with a letter or digit.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// Key names the directory of a template with these parameters:
// NAME-MEMm-CPUc, or NAME.vN-MEMm-CPUc for version N of a user template
// (Name "NAME:N"; the dot is in no name, so keys never collide).
func (p Params) Key() string {
	name, v, err := SplitRef(p.Name)
	if err == nil && v > 0 {
		return fmt.Sprintf("%s.v%d-%dm-%dc", name, v, p.MemoryMiB, p.VCPUs)
	}
	return fmt.Sprintf("%s-%dm-%dc", p.Name, p.MemoryMiB, p.VCPUs)
}

// ParamsOfKey returns the Params whose Key is key, given its memory and
// vCPUs (a capture's machine spec: the key alone does not say where the
// name ends); false if no valid Params has that key.
func ParamsOfKey(key string, memoryMiB, vcpus int) (Params, bool) {
	name, ok := strings.CutSuffix(key, fmt.Sprintf("-%dm-%dc", memoryMiB, vcpus))
	if !ok {
		return Params{}, false
	}
	if base, v, pinned := strings.Cut(name, ".v"); pinned {
		name = base + ":" + v // a user template's version: names have no '.'
	}
	p := Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
	return p, p.Validate() == nil && p.Key() == key
}

// Limits on template parameters.
const (
	MinMemoryMiB = 128
	MaxMemoryMiB = 64 << 10
	MaxVCPUs     = 32
)

// Validate checks p's fields (not that the root filesystem exists).
func (p Params) Validate() error {
	if _, _, err := SplitRef(p.Name); err != nil {
		return err
	}
	switch {
	case p.MemoryMiB < MinMemoryMiB || p.MemoryMiB > MaxMemoryMiB:
		return fmt.Errorf("%w: memory_mib %d must be between %d and %d", ErrInvalid, p.MemoryMiB, MinMemoryMiB, MaxMemoryMiB)
	case p.VCPUs < 1 || p.VCPUs > MaxVCPUs:
		return fmt.Errorf("%w: vcpus %d must be between 1 and %d", ErrInvalid, p.VCPUs, MaxVCPUs)
	}
	return nil
}

// The errors of templates (wrapped; test with errors.Is), each of a class
// of internal/contract/errs: a host's template store returns them, the
// control plane tells a missing template from a missing sandbox by them.
var (
	ErrNotFound = errs.New(errs.NotFound, "template not found")
	ErrInvalid  = errs.New(errs.Invalid, "invalid template parameters")
	// ErrConflict: the operation does not fit the template's state (e.g.
	// removing the latest version on its own).
	ErrConflict = errs.New(errs.Conflict, "template conflict")
)

// Meta is a baked template's metadata (template.json).
type Meta struct {
	Params
	Accel   accel.Accel `json:"accel"`
	Cmdline string      `json:"cmdline"`
	// Inputs are the SHA-256 hashes of kernel, initramfs, agent and rootfs,
	// and for a template whose bake starts commands (Startup) "startup",
	// the hash of those commands; for one whose bake writes files into
	// the guest first (the built-in CodeInterpreter) "files", their hash.
	Inputs  map[string]string `json:"inputs"`
	BakedAt time.Time         `json:"baked_at"`
	BakeMS  int64             `json:"bake_ms"`
	// BootID of the guest that was snapshotted.
	BootID string `json:"boot_id"`
	// DiskMiB is the size of the template's disk: what each of its
	// sandboxes may fill (and counts against its key's disk quota).
	DiskMiB int `json:"disk_mib"`
	// MAC is the MAC address of the guest's network interface
	// (guestnet.GuestMAC); "" for a template baked before guests had one,
	// which is stale.
	MAC string `json:"mac,omitempty"`
	// Machine is the device layout the template was baked on (see
	// vmm.MachineCurrent); a template of another layout is stale.
	Machine string `json:"machine,omitempty"`
}

// Progress receives human-readable progress lines during a bake.
type Progress func(msg string)

// Reserved are the names of the built-in root filesystems, which user
// templates may never take (even on a host that lacks them).
var Reserved = []string{"base", "tiny", CodeInterpreter}

// CodeInterpreter is the built-in template whose bake starts the code
// server (internal/hostagent/template/codeinterp): E2B's code-interpreter
// protocol on CodeInterpreterPort of each of its sandboxes.
const (
	CodeInterpreter     = "code-interpreter"
	CodeInterpreterPort = 49999
)

// NotAName is the one valid-looking name no template may take: the REST
// API's /v1/templates/builds is the list of template builds.
const NotAName = "builds"

// SplitRef splits a template reference: "NAME" (version 0: the latest of
// a user template, or a built-in) or "NAME:N" (version N >= 1 of a user
// template). Errors are ErrInvalid.
func SplitRef(ref string) (name string, version int, err error) {
	name, vs, pinned := strings.Cut(ref, ":")
	if !nameRE.MatchString(name) {
		return "", 0, fmt.Errorf("%w: template name %q must be 1-32 lowercase letters, digits, - or _", ErrInvalid, name)
	}
	if !pinned {
		return name, 0, nil
	}
	v, err := strconv.Atoi(vs)
	if err != nil || v < 1 || v > 1e9 || strconv.Itoa(v) != vs {
		return "", 0, fmt.Errorf("%w: template %q: a version is a number from 1 (NAME:3)", ErrInvalid, ref)
	}
	return name, v, nil
}

// Ref is the reference of version v of template name ("NAME" for 0).
func Ref(name string, v int) string {
	if v == 0 {
		return name
	}
	return name + ":" + strconv.Itoa(v)
}

// ImageConfig is what a container image's configuration says about how its
// processes run. The agent applies Env and WorkingDir to the sandboxes of a
// user template (agent.Create) as the defaults of their execs, and User as
// their default user; Entrypoint and Cmd are recorded only.
type ImageConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// EnvMap is Env ("KEY=value" each) as a map; entries without a key or
// with a NUL byte (which no process environment can hold) are left out.
// Nil when there are none.
func (c ImageConfig) EnvMap() map[string]string {
	var out map[string]string
	for _, kv := range c.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" && !strings.ContainsRune(v, 0) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// Startup names what a template's bake starts in its guest before the
// capture, so that every sandbox restored from it finds the process
// running already (each its own copy). Both commands are /bin/sh -c
// scripts run with the image's Env and WorkingDir. They are part of the
// template's identity: a change makes its baked shapes stale.
type Startup struct {
	// StartCmd is started detached (its own session, stdin /dev/null,
	// output to StartLog) once the guest agent answers; "" for none.
	StartCmd string `json:"start_cmd,omitempty"`
	// ReadyCmd is run until it exits 0 (each run at most ReadyRunTimeout)
	// before the capture; "" to capture as soon as StartCmd is started.
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// ReadyTimeoutSeconds bounds the wait for ReadyCmd to succeed
	// (0: DefaultReadyTimeout).
	ReadyTimeoutSeconds int `json:"ready_timeout_seconds,omitempty"`
}

// Limits and defaults of a Startup.
const (
	DefaultReadyTimeout = 60 * time.Second
	MaxReadyTimeout     = 30 * time.Minute
	ReadyRunTimeout     = 10 * time.Second
	MaxStartupCmdBytes  = 16 << 10
	// StartLog is where, in the guest, StartCmd's output goes.
	StartLog = "/var/log/start.log"
)

// IsZero reports whether u starts nothing.
func (u Startup) IsZero() bool { return u.StartCmd == "" && u.ReadyCmd == "" }

// Validate checks u's fields.
func (u Startup) Validate() error {
	switch {
	case len(u.StartCmd) > MaxStartupCmdBytes || len(u.ReadyCmd) > MaxStartupCmdBytes:
		return fmt.Errorf("%w: start_cmd and ready_cmd must be at most %d bytes", ErrInvalid, MaxStartupCmdBytes)
	case strings.ContainsRune(u.StartCmd, 0) || strings.ContainsRune(u.ReadyCmd, 0):
		return fmt.Errorf("%w: start_cmd and ready_cmd must not contain NUL bytes", ErrInvalid)
	case u.ReadyTimeoutSeconds < 0 || time.Duration(u.ReadyTimeoutSeconds)*time.Second > MaxReadyTimeout:
		return fmt.Errorf("%w: ready_timeout_seconds %d must be between 0 (the default, %s) and %d",
			ErrInvalid, u.ReadyTimeoutSeconds, DefaultReadyTimeout, int(MaxReadyTimeout/time.Second))
	case u.ReadyTimeoutSeconds > 0 && u.ReadyCmd == "":
		return fmt.Errorf("%w: ready_timeout_seconds needs a ready_cmd", ErrInvalid)
	}
	return nil
}

// ReadyTimeout is u's wait for ReadyCmd, its default filled in.
func (u Startup) ReadyTimeout() time.Duration {
	if u.ReadyTimeoutSeconds > 0 {
		return time.Duration(u.ReadyTimeoutSeconds) * time.Second
	}
	return DefaultReadyTimeout
}

// UserRootFS describes one version of a user template: a root
// filesystem built from a user's image or Dockerfile (on its host, the
// config.json beside its rootfs.ext4).
type UserRootFS struct {
	Name string `json:"name"`
	// Source is the image reference it was built from, Digest the image's
	// manifest digest.
	Source string      `json:"source"`
	Digest string      `json:"digest,omitempty"`
	Image  ImageConfig `json:"image"`
	Startup
	SizeBytes int64     `json:"size_bytes"`
	BuiltAt   time.Time `json:"built_at"`
	BuildMS   int64     `json:"build_ms"`
	// Version numbers the builds of Name from 1; set at install.
	Version int `json:"version,omitempty"`
	// Owner is the id of the API key that built the template's first
	// version ("" for templates built before owners were recorded: they
	// belong to admin keys): the template's, read from its latest
	// version; an install carries it over from the version it follows.
	Owner string `json:"owner,omitempty"`
	// Published makes this version, and only it, usable and listed for
	// every key (SetUserPublished). An install never sets it.
	Published bool `json:"published,omitempty"`
	// Copy marks a version a fleet's registry numbered (built for it, or
	// fetched from the object store): one whose set is gone from the
	// store was deleted (see agent.SweepUserCopies).
	Copy bool `json:"copy,omitempty"`
	// DiskBytes is what rootfs.ext4 takes on disk (its allocated blocks,
	// SizeBytes being its apparent size); measured when read, not stored.
	DiskBytes int64 `json:"-"`
}

// ReadyError is how a bake fails when a template's ready command did not
// succeed in time (or its start command could not be started). Its
// message is written for users: it holds the commands' own output, never
// the host's paths.
type ReadyError struct {
	Msg string
}

func (e *ReadyError) Error() string { return e.Msg }
