package errs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// codes are the error codes users see, as api/openapi.yaml, the SDKs and
// agents of adjacent versions know them. A class is never renamed or
// removed; adding one means adding it here and to the spec.
var codes = []string{
	"bad_request", "unauthorized", "forbidden", "not_found", "method_not_allowed",
	"conflict", "corrupt", "payload_too_large", "invalid", "quota_exceeded",
	"too_many_requests", "template_limit", "canceled", "internal", "not_implemented",
	"bad_gateway", "guest_error", "unavailable", "timeout", "insufficient_storage",
}

func TestCodes(t *testing.T) {
	var got []string
	for _, c := range errs.All {
		got = append(got, string(c))
		if !c.Known() {
			t.Errorf("%s: not Known", c)
		}
	}
	slices.Sort(got)
	want := slices.Clone(codes)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("classes:\n got %v\nwant %v", got, want)
	}
	if errs.Class("brand_new").Known() {
		t.Error("brand_new is Known")
	}
}

// The spec lists every code an answer can carry: all but canceled, which
// is answered to a client that went away.
func TestCodesInSpec(t *testing.T) {
	b, err := os.ReadFile("../../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)ErrorDetail:.*?code:\s*type: string\s*enum: \[([^\]]*)\]`).FindSubmatch(b)
	if m == nil {
		t.Fatal("api/openapi.yaml: no enum of ErrorDetail's code")
	}
	var spec []string
	for _, s := range strings.Split(string(m[1]), ",") {
		spec = append(spec, strings.TrimSpace(s))
	}
	var want []string
	for _, c := range codes {
		if c != "canceled" {
			want = append(want, c)
		}
	}
	slices.Sort(spec)
	slices.Sort(want)
	if !slices.Equal(spec, want) {
		t.Errorf("api/openapi.yaml's codes:\n got %v\nwant %v", spec, want)
	}
}

func TestClassOf(t *testing.T) {
	sentinel := errs.New(errs.NotFound, "template not found")
	other := errs.New(errs.NotFound, "not found")
	err := fmt.Errorf("template %q: %w", "py", sentinel)
	if !errors.Is(err, sentinel) || !errors.Is(err, errs.NotFound) || errors.Is(err, other) {
		t.Errorf("%v: Is sentinel %v, NotFound %v, other %v; want true, true, false",
			err, errors.Is(err, sentinel), errors.Is(err, errs.NotFound), errors.Is(err, other))
	}
	if got := err.Error(); got != `template "py": template not found` {
		t.Errorf("text: got %q", got)
	}
	cause := errors.New("disk full")
	ef := errs.Errorf(errs.NoSpace, "write %s: %w", "x", cause)
	if !errors.Is(ef, cause) || ef.Error() != "write x: disk full" {
		t.Errorf("Errorf: got %q, Is cause %v", ef, errors.Is(ef, cause))
	}
	for _, tc := range []struct {
		err  error
		want errs.Class
		ok   bool
	}{
		{nil, "", false},
		{errors.New("boom"), errs.Internal, false},
		{fmt.Errorf("get: %w", errs.NotFound), errs.NotFound, true},
		{ef, errs.NoSpace, true},
		// Of several classes, the first of All.
		{fmt.Errorf("%w, %w", errs.NotFound, errs.NoSpace), errs.NoSpace, true},
		{fmt.Errorf("%w, %w", errs.Unavailable, errs.NotFound), errs.NotFound, true},
		// A class of its own goes before the standard library's.
		{fmt.Errorf("%w: %w", errs.Conflict, context.Canceled), errs.Conflict, true},
		{fmt.Errorf("x: %w", context.Canceled), errs.Canceled, false},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), errs.Timeout, false},
		{fmt.Errorf("x: %w", errors.ErrUnsupported), errs.NotImplemented, false},
	} {
		c, ok := errs.Of(tc.err)
		if got := errs.ClassOf(tc.err); got != tc.want || ok != tc.ok || (ok && c != tc.want) {
			t.Errorf("%v: ClassOf %q, Of %q %v; want %q, %v", tc.err, got, c, ok, tc.want, tc.ok)
		}
	}
	if got := fmt.Errorf("x: %w", errs.NoSpace).Error(); got != "x: insufficient storage" {
		t.Errorf("a class's text: got %q", got)
	}
}

func TestServerSide(t *testing.T) {
	var got []errs.Class
	for _, c := range errs.All {
		if c.ServerSide() {
			got = append(got, c)
		}
	}
	want := []errs.Class{errs.NoSpace, errs.Unavailable, errs.NotImplemented, errs.Timeout, errs.BadGateway, errs.GuestError, errs.Internal}
	if !slices.Equal(got, want) {
		t.Errorf("server side: got %v, want %v", got, want)
	}
}
