package testkit

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Procs lists the live processes whose command line (/proc/PID/cmdline:
// the arguments, each ended by a NUL byte) contains s. s may hold NUL
// bytes to match arguments next to each other ("-name\x00guest=x").
// Zombies and kernel threads (empty command lines) are left out.
func Procs(s string) []int {
	return ProcsFunc(func(argv []string) bool {
		return strings.Contains(strings.Join(argv, "\x00")+"\x00", s)
	})
}

// ProcsFunc lists the live processes whose arguments match.
func ProcsFunc(match func(argv []string) bool) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 { // gone, a zombie, a kernel thread
			continue
		}
		if match(strings.Split(string(bytes.TrimSuffix(b, []byte{0})), "\x00")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// QEMUProcs lists the live QEMU processes whose command line mentions a
// path under dir.
func QEMUProcs(dir string) []int {
	return ProcsFunc(func(argv []string) bool {
		return strings.Contains(filepath.Base(argv[0]), "qemu-system") &&
			strings.Contains(strings.Join(argv, "\x00"), dir+"/")
	})
}

// Alive reports whether pid is a running (not zombie) process.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// WaitGone waits until pid is not Alive, for at most d, and reports
// whether it is gone.
func WaitGone(pid int, d time.Duration) bool {
	return Poll(d, func() bool { return !Alive(pid) })
}

// OpenFDs counts this process's open file descriptors.
func OpenFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
