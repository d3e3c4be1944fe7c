package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// User root filesystems are built from users' container images (see
// package tmplbuild) and kept in Config.UserDir, one version directory
// each, reached through a symlink named after the template:
//
//	UserDir/NAME -> .v-NAME-RAND/   (rootfs.ext4, config.json)
//
// Installing a new version writes its directory completely, then renames a
// new symlink over NAME: a reader sees the old version or the new one,
// never a mix of an old rootfs.ext4 and a new config.json. Templates baked
// from the old version become stale by themselves: their recorded rootfs
// hash no longer matches (Lookup). The old directory is removed at once
// (sandboxes never read a template's root filesystem: they clone the baked
// template's own copy).
//
// A user root filesystem never shadows a built-in one: names of the images
// directory's root filesystems, and base and tiny always, are refused.

// userConfigFile holds a user root filesystem's UserRootFS.
const userConfigFile = "config.json"

// Reserved are the names of the built-in root filesystems, which user
// templates may never take (even on a host that lacks them).
var Reserved = []string{"base", "tiny"}

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

// readyTimeout is u's wait for ReadyCmd, its default filled in.
func (u Startup) readyTimeout() time.Duration {
	if u.ReadyTimeoutSeconds > 0 {
		return time.Duration(u.ReadyTimeoutSeconds) * time.Second
	}
	return DefaultReadyTimeout
}

// UserRootFS describes a root filesystem built from a user's image
// (config.json beside its rootfs.ext4).
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
}

// IsBuiltin reports whether name is, or is reserved for, a built-in root
// filesystem.
func (s *Store) IsBuiltin(name string) bool {
	for _, r := range Reserved {
		if name == r {
			return true
		}
	}
	_, err := os.Stat(s.cfg.Images.RootFS(name))
	return err == nil
}

// ValidateUserName checks that name can name a user template: the rules
// of template names, and not a built-in one's.
func (s *Store) ValidateUserName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: template name %q must be 1-32 lowercase letters, digits, - or _", ErrInvalid, name)
	}
	if s.IsBuiltin(name) {
		return fmt.Errorf("%w: %q is a built-in template; pick another name", ErrInvalid, name)
	}
	return nil
}

// rootfsPath returns the root filesystem image of template name: the
// built-in one if there is one, else the user's; "" if neither exists.
func (s *Store) rootfsPath(name string) string {
	if p := s.cfg.Images.RootFS(name); fileExists(p) {
		return p
	}
	if s.cfg.UserDir == "" || !nameRE.MatchString(name) || s.IsBuiltin(name) {
		return ""
	}
	if p := filepath.Join(s.cfg.UserDir, name, "rootfs.ext4"); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// userNames lists the user root filesystems.
func (s *Store) userNames() []string {
	if s.cfg.UserDir == "" {
		return nil
	}
	ents, _ := os.ReadDir(s.cfg.UserDir)
	var names []string
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 && nameRE.MatchString(e.Name()) && !s.IsBuiltin(e.Name()) &&
			fileExists(filepath.Join(s.cfg.UserDir, e.Name(), "rootfs.ext4")) {
			names = append(names, e.Name())
		}
	}
	return names
}

// UserRootFS returns the description of user root filesystem name
// (ErrNotFound if there is none).
func (s *Store) UserRootFS(name string) (UserRootFS, error) {
	var u UserRootFS
	if s.cfg.UserDir == "" || !nameRE.MatchString(name) || s.IsBuiltin(name) {
		return u, fmt.Errorf("%w: no user template %q", ErrNotFound, name)
	}
	b, err := os.ReadFile(filepath.Join(s.cfg.UserDir, name, userConfigFile))
	if errors.Is(err, os.ErrNotExist) {
		return u, fmt.Errorf("%w: no user template %q", ErrNotFound, name)
	}
	if err != nil {
		return u, fmt.Errorf("read user template %s: %w", name, err)
	}
	if err := json.Unmarshal(b, &u); err != nil {
		return u, fmt.Errorf("read user template %s: %w", name, err)
	}
	return u, nil
}

// UserRootFSes lists the user root filesystems, by name.
func (s *Store) UserRootFSes() ([]UserRootFS, error) {
	var out []UserRootFS
	for _, name := range s.userNames() {
		u, err := s.UserRootFS(name)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// StageUserRootFS makes a new, empty version directory for user root
// filesystem name, in which the caller writes rootfs.ext4 before passing
// it to InstallUserRootFS (or removing it). It is on the same file system
// as the installed versions.
func (s *Store) StageUserRootFS(name string) (string, error) {
	if s.cfg.UserDir == "" {
		return "", fmt.Errorf("%w: this host keeps no user templates", ErrInvalid)
	}
	if err := s.ValidateUserName(name); err != nil {
		return "", err
	}
	if err := os.MkdirAll(s.cfg.UserDir, 0o700); err != nil {
		return "", fmt.Errorf("stage user template %s: %w", name, err)
	}
	dir, err := os.MkdirTemp(s.cfg.UserDir, ".v-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("stage user template %s: %w", name, err)
	}
	return dir, nil
}

// InstallUserRootFS makes dir (from StageUserRootFS, holding rootfs.ext4)
// the current version of user root filesystem u.Name, atomically, and
// removes the version it replaces. Callers serialize installs and removals
// of one name.
func (s *Store) InstallUserRootFS(dir string, u UserRootFS) error {
	old, err := s.installUser(dir, u)
	if err != nil {
		return err
	}
	s.removeVersion(old)
	return nil
}

// TryUserRootFS is InstallUserRootFS keeping the version it replaces
// until the caller decides: keep removes that version; undo makes it
// current again (or, if there was none, removes name and the shapes baked
// from dir's version, like RemoveUserRootFS) and removes dir. Call exactly
// one of them, with installs and removals of the name still serialized.
func (s *Store) TryUserRootFS(dir string, u UserRootFS) (keep func(), undo func() error, err error) {
	old, err := s.installUser(dir, u)
	if err != nil {
		return nil, nil, err
	}
	keep = func() { s.removeVersion(old) }
	undo = func() error {
		if old == "" {
			return s.RemoveUserRootFS(u.Name)
		}
		if err := s.pointUser(u.Name, old); err != nil {
			return fmt.Errorf("restore user template %s: %w", u.Name, err)
		}
		s.removeVersion(filepath.Base(dir))
		return nil
	}
	return keep, undo, nil
}

// removeVersion removes version directory v of UserDir ("" for none).
func (s *Store) removeVersion(v string) {
	if v != "" && !strings.Contains(v, "/") && strings.HasPrefix(v, ".v-") {
		os.RemoveAll(filepath.Join(s.cfg.UserDir, v))
	}
}

// pointUser makes name point to version directory v, atomically.
func (s *Store) pointUser(name, v string) error {
	link := filepath.Join(s.cfg.UserDir, name)
	tmp := filepath.Join(s.cfg.UserDir, ".link-"+name+"-"+randHex(4))
	if err := os.Symlink(v, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return err
	}
	syncPath(s.cfg.UserDir)
	return nil
}

// installUser makes dir the current version of u.Name and returns the
// version it replaced ("" if none), which it leaves in place.
func (s *Store) installUser(dir string, u UserRootFS) (old string, err error) {
	if err := s.ValidateUserName(u.Name); err != nil {
		return "", err
	}
	if filepath.Dir(dir) != filepath.Clean(s.cfg.UserDir) || !strings.HasPrefix(filepath.Base(dir), ".v-"+u.Name+"-") {
		return "", fmt.Errorf("install user template %s: %s is not one of its staged versions", u.Name, dir)
	}
	img := filepath.Join(dir, "rootfs.ext4")
	st, err := os.Stat(img)
	if err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	u.SizeBytes = st.Size()
	b, _ := json.MarshalIndent(u, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, userConfigFile), b, 0o600); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	for _, p := range []string{img, filepath.Join(dir, userConfigFile), dir} {
		if err := syncPath(p); err != nil {
			return "", fmt.Errorf("install user template %s: %w", u.Name, err)
		}
	}
	old, _ = os.Readlink(filepath.Join(s.cfg.UserDir, u.Name))
	if err := s.pointUser(u.Name, filepath.Base(dir)); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	if old == filepath.Base(dir) {
		old = ""
	}
	return old, nil
}

// RemoveUserRootFS removes user root filesystem name and every template
// baked from it (ErrNotFound if there is none). Sandboxes restored from
// those templates keep running: they hold their own files.
func (s *Store) RemoveUserRootFS(name string) error {
	if _, err := s.UserRootFS(name); err != nil {
		return err
	}
	link := filepath.Join(s.cfg.UserDir, name)
	target, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("remove user template %s: %w", name, err)
	}
	if err := os.Remove(link); err != nil {
		return fmt.Errorf("remove user template %s: %w", name, err)
	}
	syncPath(s.cfg.UserDir)
	if !strings.Contains(target, "/") {
		os.RemoveAll(filepath.Join(s.cfg.UserDir, target))
	}
	baked, err := s.List()
	if err != nil {
		return err
	}
	for _, t := range baked {
		if t.Name != name {
			continue
		}
		// Aside first, like a re-bake: a Lookup sees the template whole
		// or not at all.
		old := filepath.Join(s.cfg.Dir, ".old-"+t.Key()+"-"+randHex(4))
		if err := os.Rename(t.Dir, old); err == nil {
			os.RemoveAll(old)
		}
	}
	return nil
}

// removeUserLeftovers removes the versions of user root filesystems that
// no name points to (interrupted builds and installs) and returns how many.
func (s *Store) removeUserLeftovers() int {
	if s.cfg.UserDir == "" {
		return 0
	}
	live := map[string]bool{}
	ents, _ := os.ReadDir(s.cfg.UserDir)
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			if t, err := os.Readlink(filepath.Join(s.cfg.UserDir, e.Name())); err == nil {
				live[t] = true
			}
		}
	}
	var n int
	for _, e := range ents {
		name := e.Name()
		stray := strings.HasPrefix(name, ".link-") || (strings.HasPrefix(name, ".v-") && !live[name])
		if stray && os.RemoveAll(filepath.Join(s.cfg.UserDir, name)) == nil {
			n++
		}
	}
	return n
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// mergeNames returns the sorted union of a and b.
func mergeNames(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range append(append([]string(nil), a...), b...) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
