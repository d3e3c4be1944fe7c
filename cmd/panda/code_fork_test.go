package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// codeState is what TestCodeForkSnapshotPause puts in a sandbox's code
// interpreter, in three contexts: a variable, a module-level cache (a
// memoized function that records its real calls), an open file whose
// offset matters, a second Python context's own variable, and the
// JavaScript and bash default contexts' variables.
const codeState = `import functools
x = 41
calls = []
@functools.lru_cache(maxsize=None)
def square(n):
    calls.append(n)
    return n * n
square(12)
fh = open('/tmp/code-state.txt', 'w+')
fh.write('first line\n')
fh.flush()
'set'`

// checkState is a cell that reads codeState back without changing it:
// the cache answers square(12) without a new call, and the file is read
// from its start, then left at its end.
const checkState = `r = (x, square(12), len(calls), (fh.seek(0), fh.read())[1]); fh.seek(0, 2); r`

// wantState is checkState's main result in a sandbox whose kernel kept
// codeState.
const wantState = `(41, 144, 1, 'first line\n')`

// TestCodeForkSnapshotPause: the code interpreter's kernels are part of
// the machine. A fork's children start with the parent's variables,
// caches and open files in every context and diverge from there; a
// snapshot's sandbox and a paused and resumed one keep them; a fork taken
// while a cell runs leaves the cell running in the parent (its caller gets
// its end) and interrupted in the child, whose context then takes the
// next cell (docs/code-interpreter.md, "Fork, snapshots and pause").
func TestCodeForkSnapshotPause(t *testing.T) {
	w := codeWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := w.client(t, w.AdminKey())
	parent := w.codeSandbox(t, ctx, "")

	mustCell(t, ctx, parent, codeState, pandastack.RunCodeOptions{}, "'set'")
	other, err := parent.CreateCodeContext(ctx, pandastack.CodeContextOptions{Language: "python"})
	if err != nil {
		t.Fatal(err)
	}
	mustCell(t, ctx, parent, "y = 'second context'; y", pandastack.RunCodeOptions{ContextID: other.ID}, "'second context'")
	mustCell(t, ctx, parent, "let j = 6 * 7; j", pandastack.RunCodeOptions{Language: "javascript"}, "42")
	mustStdout(t, ctx, parent, "B=bash-state; cd /tmp; echo $B", pandastack.RunCodeOptions{Language: "bash"}, "bash-state\n")

	// checkAll reads every context's state in sb.
	checkAll := func(what string, sb *pandastack.Sandbox) {
		t.Helper()
		mustCell(t, ctx, sb, checkState, pandastack.RunCodeOptions{}, wantState)
		mustCell(t, ctx, sb, "y", pandastack.RunCodeOptions{ContextID: other.ID}, "'second context'")
		mustCell(t, ctx, sb, "j", pandastack.RunCodeOptions{Language: "javascript"}, "42")
		mustStdout(t, ctx, sb, "echo $B $PWD", pandastack.RunCodeOptions{Language: "bash"}, "bash-state /tmp\n")
		if t.Failed() {
			t.Fatalf("%s (%s) lost the code interpreter's state", what, sb.ID)
		}
	}
	checkAll("the parent", parent)

	// Fork: both children have it all, then diverge from each other and
	// from the parent.
	kids, err := parent.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	for _, k := range kids {
		t.Cleanup(func() { k.Kill(context.Background()) })
	}
	for i, k := range kids {
		checkAll(fmt.Sprintf("child %d", i), k)
		mustCell(t, ctx, k, fmt.Sprintf("x = %d; fh.write('child %d\\n'); fh.flush(); x", 100+i, i), pandastack.RunCodeOptions{}, fmt.Sprint(100+i))
	}
	for i, k := range kids {
		mustCell(t, ctx, k, "x, square(13), len(calls)", pandastack.RunCodeOptions{}, fmt.Sprintf("(%d, 169, 2)", 100+i))
	}
	mustCell(t, ctx, parent, "x, len(calls)", pandastack.RunCodeOptions{}, "(41, 1)")
	mustCell(t, ctx, parent, "fh.seek(0); fh.read()", pandastack.RunCodeOptions{}, `'first line\n'`)

	// A snapshot's sandbox has it all too.
	snap, err := parent.Snapshot(ctx, "")
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Cleanup(func() { c.DeleteSnapshot(context.Background(), snap.ID) })
	fromSnap, err := c.Create(ctx, pandastack.CreateOptions{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create from snapshot %s: %v", snap.ID, err)
	}
	t.Cleanup(func() { fromSnap.Kill(context.Background()) })
	checkAll("the snapshot's sandbox", fromSnap)

	// So does the parent after a pause and a resume.
	if err := parent.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if err := parent.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	checkAll("the resumed parent", parent)

	// A fork in the middle of a cell. The parent's cell waits for a file
	// the test writes once the child has been checked.
	const waiting = `import os, time
print('waiting', flush=True)
while not os.path.exists('/tmp/go'):
    time.sleep(0.02)
mid = 'done'
mid`
	started := make(chan struct{}, 1)
	type outcome struct {
		ex  *pandastack.Execution
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		ex, err := parent.RunCode(ctx, waiting, pandastack.RunCodeOptions{OnStdout: func(s string) {
			if strings.Contains(s, "waiting") {
				select {
				case started <- struct{}{}:
				default:
				}
			}
		}})
		done <- outcome{ex, err}
	}()
	select {
	case <-started:
	case o := <-done:
		t.Fatalf("the waiting cell ended before the fork: %+v %v", o.ex, o.err)
	case <-ctx.Done():
		t.Fatal("the waiting cell never printed")
	}
	mid, err := parent.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork in the middle of a cell: %v", err)
	}
	child := mid[0]
	t.Cleanup(func() { child.Kill(context.Background()) })
	// The child's copy of the cell had no caller: it was interrupted, so
	// the context takes the next cell, and the cell's end never ran.
	mustCell(t, ctx, child, "'mid' in globals(), x", pandastack.RunCodeOptions{}, "(False, 41)")
	ctxs, err := child.ListCodeContexts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, cc := range ctxs {
		if cc.State == "dead" {
			t.Errorf("the child's context %s (%s) is dead after the fork", cc.ID, cc.Language)
		}
	}
	// The parent's cell is still waiting, and its caller gets its end.
	if _, err := parent.WriteFile(ctx, "/tmp/go", strings.NewReader("go"), 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-done:
		if o.err != nil || o.ex.Error != nil || o.ex.Text() != "'done'" {
			t.Fatalf("the parent's cell after the fork: %+v, error %v", o.ex, o.err)
		}
	case <-ctx.Done():
		t.Fatal("the parent's cell did not end after /tmp/go was written")
	}
	mustCell(t, ctx, parent, "mid", pandastack.RunCodeOptions{}, "'done'")
}

// mustCell runs code in sb and fails the test unless it ends without an
// error with main result want.
func mustCell(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, code string, opts pandastack.RunCodeOptions, want string) *pandastack.Execution {
	t.Helper()
	ex, err := sb.RunCode(ctx, code, opts)
	if err != nil {
		t.Fatalf("run %q in %s: %v", code, sb.ID, err)
	}
	if ex.Error != nil {
		t.Errorf("run %q in %s: %s: %s\n%s", code, sb.ID, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
	} else if got := ex.Text(); got != want {
		t.Errorf("run %q in %s: result %q, want %q", code, sb.ID, got, want)
	}
	return ex
}

// mustStdout runs code in sb and fails the test unless it ends without an
// error having printed want.
func mustStdout(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, code string, opts pandastack.RunCodeOptions, want string) {
	t.Helper()
	ex, err := sb.RunCode(ctx, code, opts)
	if err != nil {
		t.Fatalf("run %q in %s: %v", code, sb.ID, err)
	}
	if ex.Error != nil {
		t.Errorf("run %q in %s: %s: %s", code, sb.ID, ex.Error.Name, ex.Error.Value)
	} else if got := strings.Join(ex.Logs.Stdout, ""); got != want {
		t.Errorf("run %q in %s: stdout %q, want %q", code, sb.ID, got, want)
	}
}
