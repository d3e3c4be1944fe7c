package guest

import (
	"os"
	"sync/atomic"
)

// DefaultBash is the bash that runs commands given as a string
// (ExecRequest.Shell) when the guest has it.
const DefaultBash = "/bin/bash"

// shell chooses the interpreter of commands given as a string: `bash -c`
// when the guest has bash (so bash syntax works, as users of a `cmd`
// expect), else `/bin/sh -c` (tiny, busybox templates). Not `bash -l`:
// login profiles cost ~90 ms per exec under TCG (docs/api.md, "Exec").
//
// The stat of bash is cached once it succeeded; a miss is not cached, so a
// template build that installs bash gets it on its next exec (a stat costs
// microseconds). Safe for concurrent use.
type shell struct {
	bash string      // path of bash
	have atomic.Bool // bash was seen, executable
}

// argv is the argv that runs cmd.
func (sh *shell) argv(cmd string) []string {
	if sh.hasBash() {
		return []string{sh.bash, "-c", cmd}
	}
	return []string{"/bin/sh", "-c", cmd}
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
