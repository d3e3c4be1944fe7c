package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal: its master and the terminal (slave).
func openPTY(t *testing.T) (ptm, tty *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ptm.Close() })
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tty.Close() })
	return ptm, tty
}

// TestLogLevel: a daemon given no log level logs at warn to a terminal
// and at info elsewhere.
func TestLogLevel(t *testing.T) {
	_, tty := openPTY(t)
	if got := logLevel(tty); got != "warn" {
		t.Errorf("on a terminal: %q, want warn", got)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if got := logLevel(w); got != "info" {
		t.Errorf("into a pipe: %q, want info", got)
	}
	if got := logLevel(&bytes.Buffer{}); got != "info" {
		t.Errorf("into a buffer: %q, want info", got)
	}
}

// lockedBuffer is a bytes.Buffer safe for one writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUpOnATerminal runs panda up as a person does, in a terminal, with
// --accel auto (the KVM probe runs): what it prints is the admin key, the
// address it listens on and warnings, not a flood of info lines around
// the key, nor what QEMU wrote during the KVM probe.
func TestUpOnATerminal(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	cmd, err := pandatest.Command(t.Context(), pandatest.Options{DataDir: dir, Args: []string{"--accel", "auto"}})
	if err != nil {
		t.Fatal(err)
	}
	ptm, tty := openPTY(t)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, tty, tty
	var out lockedBuffer
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close() // the server's copy stays: reading ptm ends when it exits
	copied := make(chan struct{})
	go func() {
		io.Copy(&out, ptm) // ends with EIO once the terminal is closed
		close(copied)
	}()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			<-copied
		}
	}
	defer stop()
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(out.String(), "PandaStack listening on") {
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("panda up did not say where it listens within 3 minutes:\n%s", out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling its output
	}
	stop()
	got := out.String()
	for _, want := range []string{"Created the admin API key", "    panda_", "PandaStack listening on http://"} {
		if !strings.Contains(got, want) {
			t.Errorf("panda up on a terminal does not print %q:\n%s", want, got)
		}
	}
	for _, bad := range []string{"level=INFO", "level=DEBUG", "qemu-system", "Assertion"} {
		if strings.Contains(got, bad) {
			t.Errorf("panda up on a terminal prints %q:\n%s", bad, got)
		}
	}
}
