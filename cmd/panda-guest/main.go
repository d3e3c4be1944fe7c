// Command panda-guest is the guest agent: a static binary that runs as PID 1
// inside every sandbox VM and serves the host over the virtio-serial port
// named "panda". See internal/guest and api/guest-protocol.md.
package main

import (
	"context"
	"flag"
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
)

// version is set at build time with -ldflags '-X main.version=...'.
var version = "dev"

func main() {
	pid1 := os.Getpid() == 1
	ctx := context.Background()
	if !pid1 {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
		defer stop()
	}
	for {
		err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		if !pid1 {
			if err != nil {
				fmt.Fprintln(os.Stderr, "panda-guest:", err)
				os.Exit(1)
			}
			return
		}
		// PID 1 must never exit: the kernel would panic. Start over.
		fmt.Fprintln(os.Stderr, "panda-guest:", err)
		time.Sleep(5 * time.Second)
	}
}

// run wires the agent: system setup as PID 1, the port, the reaper, the
// server and the protocol engine, in that order. With a subcommand
// (extract, sync) as its first argument it does that job instead: the
// host runs those as execs in the guest (/run/panda-guest extract).
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && os.Getpid() != 1 {
		switch args[0] {
		case "extract":
			return runExtract(args[1:], stdin, stderr)
		case "sync":
			return runSync(args[1:])
		}
	}
	flags := flag.NewFlagSet("panda-guest", flag.ContinueOnError)
	flags.SetOutput(stderr)
	portPath := flags.String("port", "", "virtio-serial port device (default: panda.port= on the kernel command line, else the port named \""+guest.PortName+"\")")
	showVersion := flags.Bool("version", false, "print the version and exit")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *showVersion {
		fmt.Fprintln(stdout, version)
		return nil
	}

	pid1 := os.Getpid() == 1
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if pid1 {
		_ = guest.InitSystem(log) // logged; best effort
		absorbSignals()
	} else if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}

	path, err := findPort(ctx, *portPath)
	if err != nil {
		return err
	}
	port, err := guest.OpenPort(path)
	if err != nil {
		return err
	}
	defer port.Close()

	reaper := guest.NewReaper(true) // PID 1 or subreaper: reap every child
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go reaper.Run(ctx)
	context.AfterFunc(ctx, func() { _ = port.Close() })

	srv := guest.NewServer(guest.Config{
		Hooks:   guest.SystemHooks{},
		Reaper:  reaper,
		Logger:  log,
		Version: version,
		PID1:    pid1,
	})
	log.Info("panda-guest started", "version", version, "port", path, "pid1", pid1)
	if err := guestproto.NewAgent(port, srv, log).Run(ctx); err != nil {
		return fmt.Errorf("serve host: %w", err)
	}
	return nil
}

// findPort resolves the port device: the flag, else panda.port= on the kernel
// command line, else the port named "panda" in sysfs, waiting for it to
// appear (its driver may still be loading).
func findPort(ctx context.Context, flagPath string) (string, error) {
	if flagPath != "" {
		return flagPath, nil
	}
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
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// absorbSignals keeps PID 1 alive: the Go runtime would exit on SIGTERM,
// SIGINT, SIGHUP... that something in the guest sends to PID 1. Handled (not
// ignored) so that processes we start get default dispositions.
func absorbSignals() {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGPWR,
		syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGSTKFLT)
	go func() {
		for range ch {
		}
	}()
}

// runExtract is `panda-guest extract [--chown SPEC] [--root DIR]`: unpack
// the tar archive on stdin at / (guest.Extract), every entry owned by SPEC
// (a Docker USER spec resolved in the guest's /etc/passwd and
// /etc/group) or by 0:0.
func runExtract(args []string, stdin io.Reader, stderr io.Writer) error {
	flags := flag.NewFlagSet("panda-guest extract", flag.ContinueOnError)
	flags.SetOutput(stderr)
	chown := flags.String("chown", "", "owner of every entry: user, uid, user:group or uid:gid (default 0:0)")
	root := flags.String("root", "/", "directory to unpack into")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 0 {
		return fmt.Errorf("extract: unexpected arguments %q (the archive is read from stdin)", flags.Args())
	}
	owner, err := guest.ResolveOwner(*root, *chown)
	if err != nil {
		return fmt.Errorf("extract: --chown %s: %w", *chown, err)
	}
	if err := guest.Extract(*root, stdin, owner); err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	return nil
}

// runSync is `panda-guest sync`: sync(2), for images that lack a sync
// binary. It returns once the kernel has written every dirty page and
// committed every file system's journal.
func runSync(args []string) error {
	if len(args) != 0 {
		return fmt.Errorf("sync: unexpected arguments %q", args)
	}
	unix.Sync()
	return nil
}
