package controlplane

import (
	"sync"
	"time"
	"unicode/utf8"
)

// Command is one command run in a sandbox through the API (exec, a
// background process or a PTY), as its history keeps it. The history is
// the plane's memory only: lost when the server restarts, dropped when
// the sandbox stops or its record goes; a fork starts with none. It never
// holds environment values or stdin.
type Command struct {
	N          int64     // its number in the sandbox's history, from 1
	Kind       string    // CommandExec, CommandProcess or CommandPTY
	Line       string    // the shell string, or argv joined by spaces; at most MaxCommandLine bytes
	PID        int       // a process's pid in the guest (0 for exec)
	StartedAt  time.Time // by the server's clock
	FinishedAt time.Time // zero: running, or its end is unknown
	ExitCode   *int      // nil: running or unknown
	Signal     string    // the signal that ended it, if one did
	DurationMS *int64    // nil: running or unknown

	guestStart int64 // a process's start as the guest reports it, to tell a reused pid apart
}

// Kinds of Command.
const (
	CommandExec    = "exec"
	CommandProcess = "process"
	CommandPTY     = "pty"
)

// Bounds of the command history.
const (
	MaxCommands    = 100  // per sandbox; the oldest go first
	MaxCommandLine = 1024 // bytes of a command line kept
)

// commands is the command history of every sandbox. Safe for concurrent
// use.
type commands struct {
	mu   sync.Mutex
	next map[string]int64 // the last number given, per sandbox
	runs map[string][]*Command
}

func newCommands() *commands {
	return &commands{next: map[string]int64{}, runs: map[string][]*Command{}}
}

// CommandLine is a command as its history shows it: the shell string or
// argv joined by spaces, cut to MaxCommandLine bytes (on a rune boundary).
func CommandLine(shell string, argv []string) string {
	line := shell
	if line == "" {
		for i, a := range argv {
			if i > 0 {
				line += " "
			}
			line += a
			if len(line) > MaxCommandLine {
				break
			}
		}
	}
	if len(line) <= MaxCommandLine {
		return line
	}
	cut := MaxCommandLine
	for cut > 0 && !utf8.RuneStart(line[cut]) {
		cut--
	}
	return line[:cut]
}

// StartCommand records that command line (CommandLine) of kind started in
// sandbox id, now; pid and guestStart (the guest's start time of a
// process, in Unix nanoseconds) identify a process. It returns the
// command's number, for FinishCommand.
func (p *Plane) StartCommand(id, kind, line string, pid int, guestStart int64) int64 {
	c := p.commands
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next[id]++
	n := c.next[id]
	runs := append(c.runs[id], &Command{N: n, Kind: kind, Line: line, PID: pid, StartedAt: p.clock().UTC(), guestStart: guestStart})
	if len(runs) > MaxCommands {
		runs = append(runs[:0:0], runs[len(runs)-MaxCommands:]...)
	}
	c.runs[id] = runs
	return n
}

// FinishCommand records the end of command n of sandbox id: exit is nil if
// it is unknown (the guest could not tell), durationMS the guest's
// measure (< 0: measured here from its start).
func (p *Plane) FinishCommand(id string, n int64, exit *int, signal string, durationMS int64) {
	p.commands.finish(id, func(c *Command) bool { return c.N == n }, exit, signal, durationMS, p.clock().UTC())
}

// ProcessEnded records the end of the background process pid of sandbox
// id that the guest started at guestStart (Unix nanoseconds), after
// durationMS by the guest's measure, if its history holds it and has no
// end for it yet. Its end is its start (the server's clock) plus that
// duration: the server may learn of it much later.
func (p *Plane) ProcessEnded(id string, pid int, guestStart int64, exit int, signal string, durationMS int64) {
	p.commands.finish(id, func(c *Command) bool {
		return c.PID == pid && c.guestStart == guestStart && c.Kind != CommandExec
	}, &exit, signal, durationMS, time.Time{})
}

// finish records the end of the first unfinished command of sandbox id
// that match selects, at at (zero: its start plus durationMS).
func (c *commands) finish(id string, match func(*Command) bool, exit *int, signal string, durationMS int64, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.runs[id] {
		if !match(r) || !r.FinishedAt.IsZero() {
			continue
		}
		if at.IsZero() {
			at = r.StartedAt.Add(time.Duration(durationMS) * time.Millisecond)
		}
		r.FinishedAt, r.Signal = at, signal
		if exit != nil {
			code := *exit
			r.ExitCode = &code
		}
		if durationMS < 0 {
			durationMS = at.Sub(r.StartedAt).Milliseconds()
		}
		r.DurationMS = &durationMS
		return
	}
}

// Commands is sandbox id's command history, oldest first (copies). It
// does not check who owns the sandbox: see Sandbox.
func (p *Plane) Commands(id string) []Command {
	c := p.commands
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Command, 0, len(c.runs[id]))
	for _, r := range c.runs[id] {
		out = append(out, *r)
	}
	return out
}

// drop forgets sandbox id's history.
func (c *commands) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.next, id)
	delete(c.runs, id)
}
