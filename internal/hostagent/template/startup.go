package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template/codeinterp"
)

// guestRun is what the commands of a bake's Startup run with: the image's
// environment, working directory and user (as the template's execs), and
// the files written into the guest before them.
type guestRun struct {
	templates.Startup
	Env  map[string]string
	Cwd  string
	User string
	// Files are written (as root) before StartCmd runs; FilesHash is
	// their content hash, the bake's "files" input ("" for none).
	Files     []codeinterp.File
	FilesHash string
}

// startupOf returns what the bake of template name starts in its guest:
// a user template's Startup and image defaults; for the built-in
// code-interpreter its code server (package codeinterp); nothing for the
// other built-ins.
func (s *Store) startupOf(name string) (guestRun, error) {
	if s.rootfsPath(name) == s.cfg.Images.RootFS(name) {
		if name == templates.CodeInterpreter {
			return guestRun{
				Startup: codeinterp.Startup(), User: codeinterp.User, Cwd: codeinterp.Home,
				Files: codeinterp.Files(), FilesHash: codeinterp.Hash(),
			}, nil
		}
		return guestRun{}, nil
	}
	u, err := s.UserRootFS(name)
	if errors.Is(err, templates.ErrNotFound) {
		return guestRun{}, nil
	}
	if err != nil {
		return guestRun{}, err
	}
	g := guestRun{Startup: u.Startup, Env: u.Image.EnvMap(), Cwd: u.Image.WorkingDir}
	if guestproto.ValidateUser(u.Image.User) == nil {
		g.User = u.Image.User // one the protocol refuses is ignored, as for execs
	}
	return g, nil
}

// startupHash is the "startup" input of a template whose bake starts u:
// "" when it starts nothing, so templates without commands keep their
// inputs.
func startupHash(u templates.Startup) string {
	if u.IsZero() {
		return ""
	}
	h := sha256.Sum256([]byte(u.StartCmd + "\x00" + u.ReadyCmd))
	return hex.EncodeToString(h[:])
}

// startScript starts "$1" detached from the exec that runs the script: in
// a session of its own (setsid, when the image has it) so that nothing
// done to the exec's process group reaches it, with its output in
// StartLog. The exec itself ends at once.
const startScript = `mkdir -p /var/log 2>/dev/null
if command -v setsid >/dev/null 2>&1; then
	setsid /bin/sh -c "$1" </dev/null >` + templates.StartLog + ` 2>&1 &
else
	/bin/sh -c "$1" </dev/null >` + templates.StartLog + ` 2>&1 &
fi`

// runStartup writes g.Files, starts g.StartCmd and waits for g.ReadyCmd
// to succeed.
func runStartup(ctx context.Context, client *guestproto.Client, g guestRun, say func(string, ...any)) error {
	if len(g.Files) > 0 {
		say("writing %d files into the guest", len(g.Files))
		for _, f := range g.Files {
			if _, err := client.WriteFile(ctx, f.Path, bytes.NewReader(f.Data), f.Mode); err != nil {
				return fmt.Errorf("write %s into the guest: %w", f.Path, err)
			}
		}
	}
	if g.StartCmd != "" {
		say("starting the start command")
		var out bytes.Buffer
		if g.User != "" {
			// The image's user runs the command: its log is made for it
			// first, as root.
			res, err := client.Exec(ctx, guestproto.ExecRequest{
				Argv:      []string{"/bin/sh", "-c", `mkdir -p /var/log && : >` + templates.StartLog + ` && chown "$1" ` + templates.StartLog, "sh", g.User},
				TimeoutMS: templates.ReadyRunTimeout.Milliseconds(),
			}, nil, &out, &out)
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", res.ExitCode, lastLines(out.String(), 10))
			}
			if err != nil {
				return &templates.ReadyError{Msg: fmt.Sprintf("the start command's log could not be made for user %q: %v", g.User, err)}
			}
			out.Reset()
		}
		res, err := client.Exec(ctx, guestproto.ExecRequest{
			Argv: []string{"/bin/sh", "-c", startScript, "sh", g.StartCmd}, Env: g.Env, Cwd: g.Cwd, User: g.User,
			TimeoutMS: templates.ReadyRunTimeout.Milliseconds(),
		}, nil, &out, &out)
		if err != nil {
			var ge *guestproto.Error
			if errors.As(err, &ge) {
				return &templates.ReadyError{Msg: fmt.Sprintf("the start command could not be started: %s", ge.Message)}
			}
			return fmt.Errorf("start command: %w", err)
		}
		if res.ExitCode != 0 {
			return &templates.ReadyError{Msg: fmt.Sprintf("the start command could not be started (exit %d): %s", res.ExitCode, lastLines(out.String(), 10))}
		}
	}
	if g.ReadyCmd == "" {
		return nil
	}
	timeout := g.ReadyTimeout()
	say("waiting for the ready command to succeed (at most %s)", timeout)
	start := time.Now()
	deadline := start.Add(timeout)
	var last string
	for tries := 1; ; tries++ {
		run := templates.ReadyRunTimeout
		if left := time.Until(deadline); left < run {
			run = max(left, time.Second)
		}
		var out bytes.Buffer
		res, err := client.Exec(ctx, guestproto.ExecRequest{
			// /bin/sh, as documented, whether or not the image has bash.
			Argv: []string{"/bin/sh", "-c", g.ReadyCmd}, Env: g.Env, Cwd: g.Cwd, User: g.User, TimeoutMS: run.Milliseconds(),
		}, nil, &capped{&out}, &capped{&out})
		switch {
		case err == nil && res.ExitCode == 0:
			say("ready after %.1fs (%d tries)", time.Since(start).Seconds(), tries)
			return nil
		case err == nil && res.TimedOut:
			last = fmt.Sprintf("timed out after %s: %s", run, lastLines(out.String(), 10))
		case err == nil:
			last = fmt.Sprintf("exit %d: %s", res.ExitCode, lastLines(out.String(), 10))
		default:
			var ge *guestproto.Error
			if !errors.As(err, &ge) {
				return fmt.Errorf("ready command: %w", err)
			}
			last = ge.Message
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("the ready command did not succeed within %s (%d tries); its last run: %s", timeout, tries, last)
			if g.StartCmd != "" {
				msg += fmt.Sprintf("; the start command's output (%s): %s", templates.StartLog, startLog(ctx, client))
			}
			return &templates.ReadyError{Msg: msg}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startLog returns the last lines of the start command's output.
func startLog(ctx context.Context, client *guestproto.Client) string {
	r, _, err := client.ReadFile(ctx, templates.StartLog)
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, 1<<20))
	if err != nil && len(b) == 0 {
		return "(unreadable: " + err.Error() + ")"
	}
	return lastLines(string(b), 10)
}

// lastLines returns the last n lines of s, joined with " | ", or
// "(no output)".
func lastLines(s string, n int) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return "(no output)"
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	out := strings.Join(lines, " | ")
	if len(out) > 2000 {
		out = "…" + out[len(out)-2000:]
	}
	return out
}

// capped keeps the last 64 KiB written to it.
type capped struct{ b *bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	c.b.Write(p)
	if c.b.Len() > 64<<10 {
		keep := append([]byte(nil), c.b.Bytes()[c.b.Len()-32<<10:]...)
		c.b.Reset()
		c.b.Write(keep)
	}
	return len(p), nil
}
