package pandastack_test

import (
	"errors"
	"io"
	"testing"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// The event stream through the SDK: a create and a kill of the key's own
// sandbox, then the end of the stream when the key is revoked; and the
// command history of the sandbox.
func TestIntegrationEventsAndCommands(t *testing.T) {
	ctx := testCtx(t)
	c, k := newKey(t, pandastack.Quotas{})
	st, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sb := create(t, c, pandastack.CreateOptions{})
	for _, want := range []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning} {
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type != pandastack.EventSandbox || ev.ID != sb.ID || ev.Sandbox == nil || ev.Sandbox.State != want || ev.Seq <= st.Seq {
			t.Errorf("event %+v, want sandbox %s %s after seq %d", ev, sb.ID, want, st.Seq)
		}
	}

	if _, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo hi"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"false"}}); err != nil {
		t.Fatal(err)
	}
	cmds, err := sb.Commands(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 2 || cmds[0].Command != "echo hi" || *cmds[0].ExitCode != 0 || cmds[1].Command != "false" || *cmds[1].ExitCode != 1 || cmds[1].Kind != "exec" {
		t.Errorf("commands: %+v", cmds)
	}

	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{pandastack.EventSandbox, pandastack.EventSandboxDeleted} {
		ev, err := st.Next()
		if err != nil || ev.Type != want || ev.ID != sb.ID {
			t.Errorf("event %+v, %v; want %s %s", ev, err, want, sb.ID)
		}
		if want == pandastack.EventSandboxDeleted && ev.StopReason != "killed" {
			t.Errorf("stop reason %q, want killed", ev.StopReason)
		}
	}
	// A stopped sandbox's history is gone.
	if cmds, err := sb.Commands(ctx); err != nil || len(cmds) != 0 {
		t.Errorf("commands of a killed sandbox: %+v, %v; want none", cmds, err)
	}
	if err := adminClient(t).RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the revoke: %+v, %v; want io.EOF", ev, err)
	}
}
