package host_test

import (
	"go/build"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/pandastack/pandastack/"

// deps returns the module's packages that pkg (a path under the module)
// imports, directly or not, outside tests.
func deps(t *testing.T, pkg string) map[string]bool {
	t.Helper()
	seen := map[string]bool{}
	var walk func(p string)
	walk = func(p string) {
		bp, err := build.ImportDir(filepath.Join("../../..", strings.TrimPrefix(p, module)), 0)
		if err != nil {
			t.Fatalf("import %s: %v", p, err)
		}
		for _, imp := range bp.Imports {
			if strings.HasPrefix(imp, module) && !seen[imp] {
				seen[imp] = true
				walk(imp)
			}
		}
	}
	walk(module + pkg)
	return seen
}

// TestSeam holds the control plane and the hosts to their one contract:
// the REST API reaches hosts only through package host, the host API does
// not depend on the REST API, the agent drives VMMs through vmm.Driver
// only, and the contract depends on no side of it.
func TestSeam(t *testing.T) {
	for _, tc := range []struct {
		pkg     string
		mustNot []string
		why     string
	}{
		{"internal/api", []string{"internal/agent", "internal/hostapi", "internal/vmm/qemu"}, "the control plane reaches hosts only through host.Host"},
		{"internal/hostapi", []string{"internal/api"}, "the host API carries the host contract, not the REST API"},
		{"internal/agent", []string{"internal/api", "internal/hostapi", "internal/vmm/qemu"}, "the agent implements host.Host and drives a vmm.Driver it is given"},
		{"internal/contract/host", []string{"internal/api", "internal/hostapi", "internal/agent", "internal/vmm/qemu"}, "the contract depends on neither side"},
	} {
		got := deps(t, tc.pkg)
		for _, p := range tc.mustNot {
			if got[module+p] {
				t.Errorf("%s depends on %s; it must not: %s", tc.pkg, p, tc.why)
			}
		}
	}
}
