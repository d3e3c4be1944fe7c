// Command hostileguest is a guest agent for tests only: the real one
// (internal/guest, as cmd/panda-guest runs it) wrapped in hostile.Guest, so
// that it bakes and serves normally until an exec of ["hostile", MODE]
// turns it against the host (see package hostile for the modes). The
// end-to-end test in cmd/panda builds it (static, CGO_ENABLED=0) and puts
// it into a copy of the guest images as /panda-guest.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/guest"
	"github.com/pandastack/pandastack/internal/testing/hostile"
)

func main() {
	for {
		err := run(context.Background(), os.Stderr)
		if os.Getpid() != 1 {
			fmt.Fprintln(os.Stderr, "hostileguest:", err)
			os.Exit(1)
		}
		// PID 1 must never exit: the kernel would panic.
		fmt.Fprintln(os.Stderr, "hostileguest:", err)
		time.Sleep(5 * time.Second)
	}
}

// run wires the agent as cmd/panda-guest does, with the hostile wrapper
// between the protocol engine and the port and server.
func run(ctx context.Context, stderr io.Writer) error {
	pid1 := os.Getpid() == 1
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if pid1 {
		_ = guest.InitSystem(log)
		absorbSignals()
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	path, err := findPort()
	if err != nil {
		return err
	}
	port, err := guest.OpenPort(path)
	if err != nil {
		return err
	}
	defer port.Close()
	reaper := guest.NewReaper(true)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go reaper.Run(ctx)
	srv := guest.NewServer(guest.Config{
		Hooks: guest.SystemHooks{}, Reaper: reaper, Logger: log, Version: "hostile", PID1: pid1,
	})
	g := hostile.New(port, srv)
	log.Info("hostile guest agent started", "port", path)
	return guestproto.NewAgent(g, g, log).Run(ctx)
}

// findPort is the panda.port= of the kernel command line, else the port
// named "panda", waited for while its driver loads.
func findPort() (string, error) {
	if b, err := os.ReadFile("/proc/cmdline"); err == nil {
		if p := guest.PortFromCmdline(string(b)); p != "" {
			return p, nil
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := guest.FindPort("/sys", guest.PortName)
		if err == nil {
			if _, err = os.Stat(p); err == nil {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			return "", errors.Join(errors.New("no guest port"), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// absorbSignals keeps PID 1 alive, as cmd/panda-guest does.
func absorbSignals() {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGPWR)
	go func() {
		for range ch {
		}
	}()
}
