package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	quota := &catalog.QuotaError{KeyID: "k1", Limit: catalog.QuotaMemory, Used: 0, Requested: 8192, Max: 4096}
	for _, tc := range []struct {
		err  error
		kind Kind
		text string // the message must contain it
		not  string // and must not contain it
	}{
		{fmt.Errorf("create sandbox: %w", host.ErrNoSpace), NoSpace, "out of disk space", ""},
		{fmt.Errorf("create sandbox: reserve sandbox: %w", quota), QuotaExceeded, "8192 MiB", "reserve sandbox"},
		{fmt.Errorf("x: %w", host.ErrNotFound), NotFound, "", ""},
		{fmt.Errorf("x: %w", templates.ErrInvalid), Invalid, "", ""},
		{fmt.Errorf("x: %w", host.ErrConflict), Conflict, "", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeNotFound, "no such file: /x")), NotFound, "no such file: /x", "exec:"},
		{guestproto.Errorf(guestproto.CodeNotEmpty, "dir"), Conflict, "", ""},
		{guestproto.Errorf(guestproto.CodeInternal, "write: no space left on device"), NoSpace, "", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeInternal, "decode REPLY: unexpected end of JSON input")), GuestError, "decode REPLY", ""},
		{guestproto.Errorf(guestproto.CodeTooLarge, "directory /tmp has more than 10000 entries"), Invalid, "10000 entries", ""},
		{fmt.Errorf("stat: %w", guestproto.ErrBusy), TooManyRequests, "", ""},
		{fmt.Errorf("exec: %w: %w", guestproto.ErrClosed, guestproto.ErrUnresponsive), Unavailable, "stopped answering", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeTimeout, "did not end the exec within its timeout")), Timeout, "within its timeout", ""},
		{fmt.Errorf("hello: %w", context.Canceled), Canceled, "", ""},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), Timeout, "", ""},
		{errors.New("disk exploded at 0x1234"), Internal, "internal error", "0x1234"},
		// Host paths are logged, never shown.
		{fmt.Errorf("snapshot: %w: %w", host.ErrNoSpace, &os.PathError{Op: "write", Path: "/var/lib/pandastack/store/snapshots/x/vm.mem", Err: syscall.ENOSPC}),
			NoSpace, "out of disk space", "/var/lib"},
		{fmt.Errorf("resume x: %w: its saved memory or disk does not match its checksums", host.ErrCorrupt), Corrupt, "checksums", ""},
		{fmt.Errorf("guest: %w", host.ErrNotReady), Unavailable, "retry", ""},
		// Where a host agent is, is logged, never shown.
		{fmt.Errorf("exec: %w", &host.UnreachableError{Addr: "https://10.0.0.21:7789", Err: errors.New("dial tcp 10.0.0.21:7789: connect: connection refused")}),
			Unavailable, "cannot be reached", "10.0.0.21"},
		{fmt.Errorf("x: %w", host.ErrUnavailable), Unavailable, "host agent unavailable", ""},
		{fmt.Errorf("start: %w", vmm.ErrExhausted), Unavailable, "no room", ""},
		{fmt.Errorf("x: %w", templates.ErrNotFound), NotFound, "", "/"},
		{fmt.Errorf("create: bake web-256m-1c: %w", &templates.ReadyError{Msg: "the ready command did not succeed within 1s (3 tries); its last run: exit 1: no"}),
			Invalid, "its last run: exit 1: no", "web-256m-1c"},
	} {
		got := Classify(tc.err)
		if got.Kind != tc.kind || !strings.Contains(got.Msg, tc.text) || (tc.not != "" && strings.Contains(got.Msg, tc.not)) {
			t.Errorf("Classify(%v) = %s %q, want %s containing %q", tc.err, got.Kind, got.Msg, tc.kind, tc.text)
		}
		if !errors.Is(got, tc.err) {
			t.Errorf("Classify(%v) does not wrap its cause", tc.err)
		}
	}
}

// An *Error anywhere in the chain is what users see, as it is.
func TestClassifyKeepsErrors(t *testing.T) {
	t.Parallel()
	e := Errorf(Conflict, "sandbox %s is %s", "x", "paused")
	got := Classify(fmt.Errorf("pause: %w", e))
	if got != e {
		t.Errorf("Classify(wrapped %v) = %v, want it unchanged", e, got)
	}
	if got, want := e.Error(), "conflict: sandbox x is paused"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
