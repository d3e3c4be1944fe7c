package controlplane_test

import (
	"go/build"
	"strings"
	"testing"
)

// The control plane knows nothing of HTTP and reaches hosts only through
// host.Host: its handlers (internal/api, internal/e2b) import it, never the
// reverse, and it imports no host implementation.
func TestImports(t *testing.T) {
	bp, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/pandastack/pandastack/"
	for _, imp := range bp.Imports {
		for _, bad := range []string{"net/http", module + "internal/api", module + "internal/e2b", module + "internal/agent",
			module + "internal/hostapi", module + "internal/vmm/qemu"} {
			if imp == bad || strings.HasPrefix(imp, bad+"/") {
				t.Errorf("control imports %s; it must not", imp)
			}
		}
	}
}
