package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/guestproto"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/vmm"
)

func TestClassify(t *testing.T) {
	quota := &catalog.QuotaError{KeyID: "k1", Limit: catalog.QuotaMemory, Used: 0, Requested: 8192, Max: 4096}
	for _, tc := range []struct {
		err    error
		status int
		code   string
		text   string // the message must contain it
		not    string // and must not contain it
	}{
		{fmt.Errorf("create sandbox: %w", host.ErrNoSpace), http.StatusInsufficientStorage, "insufficient_storage", "out of disk space", ""},
		{fmt.Errorf("create sandbox: reserve sandbox: %w", quota), http.StatusTooManyRequests, "quota_exceeded", "8192 MiB", "reserve sandbox"},
		{fmt.Errorf("x: %w", host.ErrNotFound), http.StatusNotFound, "not_found", "", ""},
		{fmt.Errorf("x: %w", template.ErrInvalid), http.StatusUnprocessableEntity, "invalid", "", ""},
		{fmt.Errorf("x: %w", host.ErrConflict), http.StatusConflict, "conflict", "", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeNotFound, "no such file: /x")), http.StatusNotFound, "not_found", "no such file: /x", "exec:"},
		{guestproto.Errorf(guestproto.CodeNotEmpty, "dir"), http.StatusConflict, "conflict", "", ""},
		{guestproto.Errorf(guestproto.CodeInternal, "write: no space left on device"), http.StatusInsufficientStorage, "insufficient_storage", "", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeInternal, "decode REPLY: unexpected end of JSON input")), http.StatusBadGateway, "guest_error", "decode REPLY", ""},
		{guestproto.Errorf(guestproto.CodeTooLarge, "directory /tmp has more than 10000 entries"), http.StatusUnprocessableEntity, "invalid", "10000 entries", ""},
		{fmt.Errorf("stat: %w", guestproto.ErrBusy), http.StatusTooManyRequests, "too_many_requests", "", ""},
		{fmt.Errorf("exec: %w: %w", guestproto.ErrClosed, guestproto.ErrUnresponsive), http.StatusServiceUnavailable, "unavailable", "stopped answering", ""},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeTimeout, "did not end the exec within its timeout")), http.StatusGatewayTimeout, "timeout", "within its timeout", ""},
		{fmt.Errorf("hello: %w", context.Canceled), 499, "canceled", "", ""},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), http.StatusGatewayTimeout, "timeout", "", ""},
		{errors.New("disk exploded at 0x1234"), http.StatusInternalServerError, "internal", "internal error", "0x1234"},
		// Host paths are logged, never shown.
		{fmt.Errorf("snapshot: %w: %w", host.ErrNoSpace, &os.PathError{Op: "write", Path: "/var/lib/pandastack/store/snapshots/x/vm.mem", Err: syscall.ENOSPC}),
			http.StatusInsufficientStorage, "insufficient_storage", "out of disk space", "/var/lib"},
		{fmt.Errorf("resume x: %w: its saved memory or disk does not match its checksums", host.ErrCorrupt), http.StatusConflict, "corrupt", "checksums", ""},
		{fmt.Errorf("guest: %w", host.ErrNotReady), http.StatusServiceUnavailable, "unavailable", "retry", ""},
		{fmt.Errorf("start: %w", vmm.ErrExhausted), http.StatusServiceUnavailable, "unavailable", "no room", ""},
		{fmt.Errorf("x: %w", template.ErrNotFound), http.StatusNotFound, "not_found", "", "/"},
		{fmt.Errorf("create: bake web-256m-1c: %w", &template.ReadyError{Msg: "the ready command did not succeed within 1s (3 tries); its last run: exit 1: no"}),
			http.StatusUnprocessableEntity, "invalid", "its last run: exit 1: no", "web-256m-1c"},
	} {
		got := classify(tc.err)
		if got.Status != tc.status || got.Code != tc.code || !strings.Contains(got.Message, tc.text) ||
			(tc.not != "" && strings.Contains(got.Message, tc.not)) {
			t.Errorf("classify(%v) = %d %s %q, want %d %s containing %q", tc.err, got.Status, got.Code, got.Message, tc.status, tc.code, tc.text)
		}
	}
}
