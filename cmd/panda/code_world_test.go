package main

import (
	"context"
	"testing"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// The code interpreter's tests (code_*_test.go) run on the security
// tests' server (secWorld: `panda up` with networking on, in namespaces
// of its own, whose only "internet" is a second test-made namespace): the
// code interpreter is reached over the sandbox's network (DialGuest), and
// sharing the server bakes the code-interpreter template once per test
// binary instead of once per world.

// codeTemplate is the built-in template the code tests create from, and
// codeMemoryMiB the one shape they use (each shape is baked on its own).
const (
	codeTemplate  = "code-interpreter"
	codeMemoryMiB = 512
)

// codeWorld returns the shared server of the code interpreter's tests.
func codeWorld(t *testing.T) *secWorld {
	t.Helper()
	return security(t)
}

// codeSandbox creates a code-interpreter sandbox of key's (the admin key
// if key is "") with a TTL of ten minutes, and kills it when the test
// ends.
func (w *secWorld) codeSandbox(t *testing.T, ctx context.Context, key string) *pandastack.Sandbox {
	t.Helper()
	if key == "" {
		key = w.AdminKey()
	}
	c := w.client(t, key)
	sb, err := c.Create(ctx, pandastack.CreateOptions{Template: codeTemplate, MemoryMiB: codeMemoryMiB, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create a %s sandbox: %v", codeTemplate, err)
	}
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Kill(kctx); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	return sb
}
