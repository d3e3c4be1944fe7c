package rest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// TestErrorAnswers holds what users see of a representative error of
// every error class the control plane meets (the catalog's, a host's,
// templates', builds', network policies', guests', the context's): its
// status, code and message. It was written before the error classes moved
// to internal/contract/errs and proves that the move changed none of them
// (but for the storage's, which had no class: see below).
// Every error that a host can report is tried twice: as the host agent
// returns it in `panda up`, and as it comes back over the host RPC.
func TestErrorAnswers(t *testing.T) {
	_, policyErr := netpolicy.Parse([]byte(`{"allow_out": ["300.1.2.3"]}`))
	if policyErr == nil {
		t.Fatal("netpolicy.Parse accepted 300.1.2.3")
	}
	guestBig := guestproto.Errorf(guestproto.CodeInternal, "%0600d", 0)
	for _, tc := range []struct {
		name   string
		err    error
		remote bool // the error also goes over the host RPC, and is answered the same
		status int
		code   string
		msg    string
	}{
		// The control plane's own, and the HTTP layer's.
		{"plane error", controlplane.Errorf(controlplane.Conflict, "sandbox sb1 is paused"), false, 409, "conflict", "sandbox sb1 is paused"},
		{"body too large", &http.MaxBytesError{Limit: 10}, false, 413, "payload_too_large", "request body is larger than 10 bytes"},
		{"unknown", errors.New("boom"), true, 500, "internal", "internal error"},

		// The catalog.
		{"catalog not found", fmt.Errorf("sandbox sb1: %w", catalog.ErrNotFound), false, 404, "not_found", "sandbox sb1: not found"},
		{"catalog conflict", fmt.Errorf("key k1: %w", catalog.ErrConflict), false, 409, "conflict", "key k1: already exists"},
		{"catalog quota", fmt.Errorf("reserve: %w", &catalog.QuotaError{KeyID: "k1", Limit: catalog.QuotaSandboxes, Used: 2, Requested: 1, Max: 2}), false,
			429, "quota_exceeded", (&catalog.QuotaError{KeyID: "k1", Limit: catalog.QuotaSandboxes, Used: 2, Requested: 1, Max: 2}).Error()},
		{"catalog quota bare", fmt.Errorf("reserve: %w", catalog.ErrQuota), false, 429, "quota_exceeded", "reserve: quota exceeded"},

		// The scheduler's and the fleet's: the Plane and the fleet answer
		// them as these kinds with these messages before they get here, as
		// they always have. The object store's and the chunk store's: a
		// host translates those it meets into its own (an object that is
		// not there is a snapshot that is not); one that reaches a user
		// untranslated, "internal error" before the classes were one set,
		// is now answered as its class.
		{"scheduler invalid", fmt.Errorf("place: %w", scheduler.ErrInvalid), false, 422, "invalid", "place: invalid placement request"},
		{"fleet invalid", fmt.Errorf("register: %w", fleet.ErrInvalid), false, 422, "invalid", "register: invalid registration"},
		{"object not found", fmt.Errorf("get k: %w", objstore.ErrNotFound), true, 404, "not_found", "get k: object not found"},
		{"object exists", fmt.Errorf("put k: %w", objstore.ErrExists), true, 409, "conflict", "put k: object exists"},
		{"chunks busy", fmt.Errorf("gc: %w", chunkstore.ErrBusy), true, 503, "unavailable", "gc: an upload is in progress"},

		// A host's.
		{"host not found", fmt.Errorf("sandbox sb1: %w", host.ErrNotFound), true, 404, "not_found", "sandbox sb1: not found"},
		{"host conflict", fmt.Errorf("sandbox sb1 is paused: %w", host.ErrConflict), true, 409, "conflict", "sandbox sb1 is paused: wrong state"},
		{"host invalid", fmt.Errorf("%w: memory_mib 3", host.ErrInvalid), true, 422, "invalid", "invalid request: memory_mib 3"},
		{"host no space", fmt.Errorf("restore /var/lib/x: %w", host.ErrNoSpace), true, 507, "insufficient_storage", "the host is out of disk space for sandboxes; kill sandboxes or delete snapshots"},
		{"host corrupt", fmt.Errorf("snapshot sn1: %w", host.ErrCorrupt), true, 409, "corrupt", "snapshot sn1: corrupt"},
		{"host exhausted", fmt.Errorf("vmm: %w", host.ErrExhausted), false, 503, "unavailable", "the host has no room for more sandboxes right now; retry later"},
		{"host not ready", fmt.Errorf("exec: %w", host.ErrNotReady), true, 503, "unavailable", "the sandbox's guest agent has not answered since the server restarted; retry in a few seconds"},
		{"host unavailable", fmt.Errorf("%w: shutting down", host.ErrUnavailable), true, 503, "unavailable", "host agent unavailable: shutting down"},
		{"host unreachable", &host.UnreachableError{Addr: "https://10.0.0.1:7070", Err: errors.New("connection refused")}, false,
			503, "unavailable", "a host agent cannot be reached right now; retry in a few seconds"},
		{"host shutdown", fmt.Errorf("stopped: %w", host.ErrHostShutdown), false, 500, "internal", "internal error"},
		{"agent token", fmt.Errorf("%w: send a token", hostwire.ErrUnauthorized), true, 500, "internal", "internal error"},

		// Templates'.
		{"template not found", fmt.Errorf("template %q: %w", "py", templates.ErrNotFound), true, 404, "not_found", `template "py": template not found`},
		{"template invalid", fmt.Errorf("%w: vcpus 99", templates.ErrInvalid), true, 422, "invalid", "invalid template parameters: vcpus 99"},
		{"template conflict", fmt.Errorf("remove py:3: %w", templates.ErrConflict), true, 409, "conflict", "remove py:3: template conflict"},
		{"template bake", fmt.Errorf("bake: %w", &templates.ReadyError{Msg: "exit 1: no python"}), false, 422, "invalid", "the template's bake failed: exit 1: no python"},

		// Template builds'.
		{"build not found", fmt.Errorf("build b1: %w", builds.ErrNotFound), true, 404, "not_found", "build b1: not found"},
		{"build conflict", fmt.Errorf("template py: %w", builds.ErrConflict), true, 409, "conflict", "template py: conflict"},
		{"builds closed", builds.ErrClosed, true, 503, "unavailable", "template builds are shutting down"},
		{"builds unsupported", builds.ErrUnsupported, true, 501, "not_implemented", "this server does not build templates from Dockerfiles yet; build and push an image, and build the template with from_image"},
		{"build limit", fmt.Errorf("%w: 10 templates", builds.ErrLimit), true, 429, "template_limit", "template limit reached: 10 templates"},
		{"builds busy", fmt.Errorf("%w: 2 builds", builds.ErrBusy), true, 429, "too_many_requests", "too many template builds: 2 builds"},
		{"builds no space", fmt.Errorf("%w: 1 GiB free", builds.ErrNoSpace), true, 507, "insufficient_storage", "no space for template builds: 1 GiB free"},

		// Network policies'.
		{"policy entry", fmt.Errorf("create: %w", policyErr), false, 400, "bad_request", policyErr.Error()},
		// A host refusing a create for its policy: the entry locally; over
		// the host RPC, the host's class (its name goes first), as always.
		{"policy on a host", fmt.Errorf("create sandbox: %w: %w", host.ErrInvalid, policyErr), false, 400, "bad_request", policyErr.Error()},
		{"policy on a host remote", remote(fmt.Errorf("create sandbox: %w: %w", host.ErrInvalid, policyErr)), false,
			422, "invalid", "create sandbox: invalid request: " + policyErr.Error()},
		{"policy bare", fmt.Errorf("%w: too many entries", netpolicy.ErrInvalid), false, 400, "bad_request", "invalid network policy: too many entries"},

		// Guests'.
		{"guest not found", fmt.Errorf("read: %w", guestproto.Errorf(guestproto.CodeNotFound, "/x: no such file")), true, 404, "not_found", "/x: no such file"},
		{"guest exists", guestproto.Errorf(guestproto.CodeExists, "/x exists"), true, 409, "conflict", "/x exists"},
		{"guest not empty", guestproto.Errorf(guestproto.CodeNotEmpty, "/x not empty"), true, 409, "conflict", "/x not empty"},
		{"guest exited", guestproto.Errorf(guestproto.CodeExited, "exited"), true, 409, "conflict", "exited"},
		{"guest not dir", guestproto.Errorf(guestproto.CodeNotDir, "/x/y"), true, 422, "invalid", "/x/y"},
		{"guest is dir", guestproto.Errorf(guestproto.CodeIsDir, "/x"), true, 422, "invalid", "/x"},
		{"guest invalid", guestproto.Errorf(guestproto.CodeInvalid, "relative path"), true, 422, "invalid", "relative path"},
		{"guest too large", guestproto.Errorf(guestproto.CodeTooLarge, "listing"), true, 422, "invalid", "listing"},
		{"guest permission", guestproto.Errorf(guestproto.CodePermission, "/root"), true, 403, "forbidden", "/root"},
		{"guest timeout", fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeTimeout, "took 5s")), false, 504, "timeout", "took 5s"},
		{"guest busy", guestproto.ErrBusy, true, 429, "too_many_requests", "the sandbox has too many operations in flight (exec, files); wait for some to finish"},
		{"guest internal", guestproto.Errorf(guestproto.CodeInternal, "panic"), true, 502, "guest_error", "the sandbox's guest agent failed: panic"},
		{"guest internal long", guestBig, true, 502, "guest_error", "the sandbox's guest agent failed: " + guestBig.Message[:512] + "…"},
		{"guest no space", guestproto.Errorf(guestproto.CodeInternal, "write /x: No space left on device"), true, 507, "insufficient_storage", "the sandbox is out of disk space"},
		{"guest canceled", guestproto.Errorf(guestproto.CodeCanceled, "reset"), true, 500, "internal", "internal error"},
		{"guest closed", fmt.Errorf("exec: %w", guestproto.ErrClosed), false, 503, "unavailable", "the sandbox's guest agent stopped answering; retry, or kill the sandbox"},
		{"guest unresponsive", guestproto.ErrUnresponsive, false, 503, "unavailable", "the sandbox's guest agent stopped answering; retry, or kill the sandbox"},

		// Over the host RPC, a guest's timeout is the context's (the agent
		// sends it as "timeout"). A policy's entry had no code on the host
		// RPC (it was internal there); it goes as its class now, and its
		// text is the agent's.
		{"guest timeout remote", remote(fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeTimeout, "took 5s"))), false, 504, "timeout", "the operation timed out"},
		{"policy entry remote", remote(fmt.Errorf("create: %w", policyErr)), false, 400, "bad_request", "create: " + policyErr.Error()},

		// The standard library's.
		{"canceled", fmt.Errorf("create: %w", context.Canceled), true, 499, "canceled", "the request was canceled"},
		{"deadline", fmt.Errorf("create: %w", context.DeadlineExceeded), true, 504, "timeout", "the operation timed out"},
		{"unsupported", fmt.Errorf("%w: no lazy restore", errors.ErrUnsupported), true, 501, "not_implemented", "unsupported operation: no lazy restore"},
	} {
		check := func(how string, err error) {
			t.Helper()
			got := classify(err)
			if got.Status != tc.status || got.Code != tc.code || got.Message != tc.msg {
				t.Errorf("%s (%s): got %d %s %q, want %d %s %q", tc.name, how, got.Status, got.Code, got.Message, tc.status, tc.code, tc.msg)
			}
		}
		check("local", tc.err)
		if tc.remote {
			check("over the host RPC", remote(tc.err))
		}
	}
}

// remote is err as the control plane reads it back from a host agent.
func remote(err error) error {
	_, we := hostwire.EncodeError(err)
	return we.Err()
}
