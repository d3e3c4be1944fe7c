package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// loginShell is what panda shell runs by default. A Cmd with bash runs in
// a login bash already, which ran the profiles and put back the explicit
// variables (docs/api.md, "Which shell runs cmd"); the interactive bash
// it becomes reads ~/.bashrc (prompt, aliases) without running the
// profiles again, which would replace an explicit PATH. Without bash,
// sh -l reads /etc/profile.
const loginShell = `if [ -x /bin/bash ]; then exec /bin/bash -i; else exec /bin/sh -l; fi`

func shellCmd(g *globals) *cobra.Command {
	var (
		user string
		env  []string
		cwd  string
	)
	cmd := &cobra.Command{
		Use:   "shell ID [flags] [-- CMD [ARGS...]]",
		Short: "Open an interactive terminal in a sandbox; exits with the shell's exit code",
		Long: `Open an interactive terminal in a sandbox: an interactive bash after the
login profiles (as a login shell, but the variables of the template, the
sandbox and --env win over the profiles; sh -l without bash), or CMD, on a
pseudo-terminal the size of yours. Your
terminal is put in raw mode (keys such as Ctrl-C go to the sandbox) and
restored at the end; resizing your window resizes the remote terminal.
panda exits with the remote exit code.

If standard input is not a terminal it is sent as typed (then Ctrl-D at its
end), so a script can drive a shell.`,
		Example: `  panda shell $ID
  panda shell $ID --user 1000 -- python3
  echo 'uname -a; exit' | panda shell $ID`,
		Args: args(1, -1),
		RunE: func(cmd *cobra.Command, args []string) error {
			args, err := commandArgs(cmd, args, 1)
			if err != nil {
				return orUsage(cmd, err)
			}
			e, err := pairs("env", env)
			if err != nil {
				return err
			}
			c := pandastack.Command{Cmd: loginShell, Env: e, Cwd: cwd, User: user, Timeout: pandastack.NoTimeout}
			switch rest := args[1:]; len(rest) {
			case 0:
			case 1:
				c.Cmd = rest[0]
			default:
				c.Cmd, c.Argv = "", rest
			}
			sb, err := g.sandbox(args[0])
			if err != nil {
				return err
			}
			code, err := runShell(cmd.Context(), g, sb, c, cmd.InOrStdin(), cmd.OutOrStdout())
			if err != nil {
				return fmt.Errorf("shell in %s: %w", args[0], err)
			}
			if code != 0 {
				return ExitError{Code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&user, "user", "u", "", "run as USER, NAME|UID[:GROUP|GID] as Docker's (default the template image's user, else root)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	f.StringVarP(&cwd, "cwd", "w", "", "working directory (default the user's home)")
	return cmd
}

// termSize is the size of the terminal f, if it is one.
func termSize(f any) (pandastack.PTYSize, bool) {
	if file, ok := f.(*os.File); ok {
		if ws, err := unix.IoctlGetWinsize(int(file.Fd()), unix.TIOCGWINSZ); err == nil && ws.Row > 0 && ws.Col > 0 {
			return pandastack.PTYSize{Rows: int(ws.Row), Cols: int(ws.Col)}, true
		}
	}
	return pandastack.PTYSize{}, false
}

// makeRaw puts the terminal f in raw mode, if it is one, and returns how
// to restore it (nil if it is not a terminal).
func makeRaw(f any) func() {
	file, ok := f.(*os.File)
	if !ok {
		return nil
	}
	fd := int(file.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil
	}
	raw := *old
	// cfmakeraw(3)
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		return nil
	}
	return func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }
}

// ttyURL is the WebSocket URL of a process's terminal.
func ttyURL(apiURL, sandboxID string, pid int) (string, error) {
	u, err := url.Parse(strings.TrimRight(apiURL, "/"))
	if err != nil {
		return "", fmt.Errorf("api url: %w", err)
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	}
	u.Path += "/v1/sandboxes/" + url.PathEscape(sandboxID) + "/processes/" + strconv.Itoa(pid) + "/tty"
	return u.String(), nil
}

// ttyFrame is a text frame of the terminal WebSocket.
type ttyFrame struct {
	Type     string `json:"type"`
	Rows     int    `json:"rows,omitempty"`
	Cols     int    `json:"cols,omitempty"`
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// runShell starts c on a terminal in sb and connects in and out to it
// over the terminal WebSocket until it exits; it returns the exit code.
// The process is removed at the end (killed if it still runs).
func runShell(ctx context.Context, g *globals, sb *pandastack.Sandbox, c pandastack.Command, in io.Reader, out io.Writer) (int, error) {
	size, ok := termSize(out)
	if !ok {
		if size, ok = termSize(in); !ok {
			size = pandastack.PTYSize{Rows: 24, Cols: 80}
		}
	}
	c.PTY = &size
	p, err := sb.StartProcess(ctx, c)
	if err != nil {
		return 0, err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = p.Kill(rctx)
	}()
	u, err := ttyURL(g.url(), sb.ID, p.PID)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + g.key()}},
		Subprotocols: []string{"pandastack.v1"},
	})
	if err != nil {
		return 0, fmt.Errorf("connect to the terminal: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)

	// Raw mode last, so that errors above print normally; restored on
	// every way out, signals included (they cancel ctx).
	if restore := makeRaw(in); restore != nil {
		defer restore()
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGWINCH, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT)
	defer signal.Stop(sigs)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-sigs:
				if sig != syscall.SIGWINCH {
					cancel()
					return
				}
				if z, ok := termSize(out); ok {
					b, _ := json.Marshal(ttyFrame{Type: "resize", Rows: z.Rows, Cols: z.Cols})
					_ = conn.Write(ctx, websocket.MessageText, b)
				}
			}
		}
	}()
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = conn.Write(ctx, websocket.MessageBinary, []byte{4}) // ^D: end of input
				}
				return
			}
		}
	}()
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return 130, nil // interrupted by a signal
			}
			return 0, fmt.Errorf("terminal connection: %w", err)
		}
		if typ == websocket.MessageBinary {
			if _, err := out.Write(b); err != nil {
				return 0, err
			}
			continue
		}
		var f ttyFrame
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		switch {
		case f.Type == "exit" && f.ExitCode != nil:
			return *f.ExitCode, nil
		case f.Type == "error" && f.Error != nil:
			return 0, fmt.Errorf("%s: %s", f.Error.Code, f.Error.Message)
		}
	}
}
