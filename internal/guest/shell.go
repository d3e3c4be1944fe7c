package guest

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
)

// DefaultBash is the bash that runs commands given as a string
// (ExecRequest.Shell) when the guest has it.
const DefaultBash = "/bin/bash"

// DefaultLoginEnvFile is where the agent keeps loginEnvScript.
const DefaultLoginEnvFile = "/run/panda/login-env.sh"

// loginEnvVar carries the explicit variables to loginEnvScript.
const loginEnvVar = "PANDA_LOGIN_ENV"

// loginEnvScript runs in every login bash the agent starts with explicit
// variables (BASH_ENV: bash reads it after /etc/profile and ~/.profile).
// It puts back what the template, the sandbox or the command set, which
// the profiles may have overwritten (Debian's /etc/profile sets PATH), and
// keeps the PATH entries the profiles added (~/.local/bin, ~/.cargo/bin)
// after the explicit ones. It unsets BASH_ENV first: scripts the command
// runs must not read it again.
const loginEnvScript = `# Written by panda-guest (the guest agent); see docs/api.md, "Which shell runs cmd".
unset BASH_ENV
__panda_p=$PATH:
eval "$` + loginEnvVar + `"
unset ` + loginEnvVar + `
while [ -n "$__panda_p" ]; do
	__panda_d=${__panda_p%%:*}
	__panda_p=${__panda_p#*:}
	case ":$PATH:" in
	*":$__panda_d:"*) ;;
	*) [ -z "$__panda_d" ] || PATH=$PATH:$__panda_d ;;
	esac
done
unset __panda_p __panda_d
`

// shell chooses the interpreter of commands given as a string: a login
// bash (`bash -l -c`, as E2B's envd runs them) when the guest has bash, so
// bash syntax works and what templates put in /etc/profile.d or
// ~/.profile is set up; else `/bin/sh -c` (tiny, busybox templates). The
// variables set explicitly win over the profiles (loginEnvScript).
//
// The stat of bash is cached once it succeeded; a miss is not cached, so a
// template build that installs bash gets it on its next exec (a stat costs
// microseconds). Safe for concurrent use.
type shell struct {
	bash     string      // path of bash
	loginEnv string      // path of loginEnvScript
	have     atomic.Bool // bash was seen, executable
	wrote    atomic.Bool // loginEnvScript was written by this agent
}

// argv is the argv that runs cmd, and whether it is a login bash.
func (sh *shell) argv(cmd string) (argv []string, login bool) {
	if sh.hasBash() {
		return []string{sh.bash, "-l", "-c", cmd}, true
	}
	return []string{"/bin/sh", "-c", cmd}, false
}

func (sh *shell) hasBash() bool {
	if sh.have.Load() {
		return true
	}
	fi, err := os.Stat(sh.bash)
	ok := err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
	if ok {
		sh.have.Store(true)
	}
	return ok
}

// forget drops the cached stat: bash went away (lookPath failed on it).
func (sh *shell) forget() { sh.have.Store(false) }

// keepExplicit adds to env (a login bash's) what makes the explicit
// variables win over the login profiles: BASH_ENV at loginEnvScript and
// PANDA_LOGIN_ENV with their assignments. Only names a shell can assign
// are carried (profiles cannot set the others). The script is written
// again if something removed it.
func (sh *shell) keepExplicit(env map[string]string, explicit map[string]string) error {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(explicit)) {
		if !shellName(k) || k == loginEnvVar {
			continue
		}
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(explicit[k]))
	}
	if b.Len() == 0 {
		return nil
	}
	if err := sh.ensureScript(); err != nil {
		return fmt.Errorf("write %s: %w", sh.loginEnv, err)
	}
	env["BASH_ENV"] = sh.loginEnv
	env[loginEnvVar] = b.String()
	return nil
}

// ensureScript makes sh.loginEnv hold loginEnvScript. Once this agent
// wrote it, an exec only checks that it is still there (one stat, not a
// read on every exec); a missing one is written again.
func (sh *shell) ensureScript() error {
	if sh.wrote.Load() {
		if _, err := os.Stat(sh.loginEnv); err == nil {
			return nil
		}
	}
	if err := ensureFile(sh.loginEnv, []byte(loginEnvScript)); err != nil {
		return err
	}
	sh.wrote.Store(true)
	return nil
}

// ensureFile makes path hold data (mode 0644, its directory 0755), unless
// it does already.
func ensureFile(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".login-env-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: no such file
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// shellName reports whether k is a name a POSIX shell can assign.
func shellName(k string) bool {
	if k == "" || (k[0] >= '0' && k[0] <= '9') {
		return false
	}
	for _, c := range []byte(k) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// shellQuote quotes s for a POSIX shell: single-quoted, each quote inside
// closed, escaped and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
