package controlplane_test

import (
	"go/build"
	"strings"
	"testing"
)

// The Plane knows nothing of HTTP: its handlers (rest, e2b) import it,
// never the reverse. (That no control-plane package reaches host code is
// internal/tiers_test.go's rule.)
func TestImports(t *testing.T) {
	t.Parallel()
	bp, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	const module = "github.com/pandastack/pandastack/"
	for _, imp := range bp.Imports {
		for _, bad := range []string{"net/http", module + "internal/controlplane/rest", module + "internal/controlplane/e2b"} {
			if imp == bad || strings.HasPrefix(imp, bad+"/") {
				t.Errorf("controlplane imports %s; it must not", imp)
			}
		}
	}
}
