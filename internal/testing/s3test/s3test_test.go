package s3test

import (
	"os"
	"regexp"
	"syscall"
	"testing"
)

// The Makefile builds the version the tests look for.
func TestMakefileVersion(t *testing.T) {
	b, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSITYGW_VERSION\s*:?=\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Makefile sets no VERSITYGW_VERSION")
	}
	if got := string(m[1]); got != Version {
		t.Errorf("Makefile's VERSITYGW_VERSION = %s, s3test.Version = %s", got, Version)
	}
}

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	pid := s.PID()
	s.Stop()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("versitygw pid %d still exists after Stop", pid)
	}
	s.Restart()
	if s.PID() == pid {
		t.Errorf("Restart did not start a new process")
	}
}
