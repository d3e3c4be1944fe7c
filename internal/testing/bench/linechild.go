package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// lineChild is a long-lived helper process of a benchmark (an SDK of
// another language) spoken to one line at a time: a request on its
// stdin, one answer line on its stdout. Its start-up is never measured.
type lineChild struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	stdin  io.WriteCloser
	lines  *bufio.Scanner
	stderr strings.Builder // read only once the child has ended
}

// startLineChild starts name args with env added to ours, in dir.
func startLineChild(ctx context.Context, dir string, env []string, name string, args ...string) (*lineChild, error) {
	cctx, cancel := context.WithCancel(ctx)
	c := &lineChild{name: name, cancel: cancel, cmd: exec.CommandContext(cctx, name, args...)}
	c.cmd.Dir = dir
	c.cmd.Env = env
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		cancel()
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	c.lines = bufio.NewScanner(out)
	c.lines.Buffer(make([]byte, 64<<10), 1<<20)
	if err := c.cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return c, nil
}

// send writes line and reads the answer.
func (c *lineChild) send(line string) ([]byte, error) {
	if _, err := io.WriteString(c.stdin, line+"\n"); err != nil {
		return nil, fmt.Errorf("write to %s: %w (stderr: %s)", c.name, err, c.ended())
	}
	return c.read()
}

// read reads the next answer line.
func (c *lineChild) read() ([]byte, error) {
	if !c.lines.Scan() {
		return nil, fmt.Errorf("%s ended: %v (stderr: %s)", c.name, c.lines.Err(), c.ended())
	}
	return c.lines.Bytes(), nil
}

// ended waits for a child that stopped answering and returns its stderr.
func (c *lineChild) ended() string {
	c.stop()
	return strings.TrimSpace(c.stderr.String())
}

// stop closes the child's stdin (EOF ends it) and waits for it, killing it
// after 10 s.
func (c *lineChild) stop() {
	c.stdin.Close()
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		c.cancel()
		<-done
	}
	c.cancel()
}
