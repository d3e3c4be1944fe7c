package guest_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestGuestImportsNoHostCode enforces that the guest agent and the protocols
// it shares with the host depend on the standard library, golang.org/x/sys,
// go-fuse (the volume file system) and each other only, and the error
// classes (contract/errs: guestproto's codes are of them), which import the
// standard library only (their tests may also use testkit, which imports
// the standard library only).
func TestGuestImportsNoHostCode(t *testing.T) {
	allowed := func(path string) bool {
		first, _, _ := strings.Cut(path, "/")
		return !strings.Contains(first, ".") ||
			strings.HasPrefix(path, "golang.org/x/sys/") ||
			strings.HasPrefix(path, "github.com/hanwen/go-fuse/v2/") ||
			path == "github.com/pandastack/pandastack/internal/contract/volproto" ||
			path == "github.com/pandastack/pandastack/internal/guest" ||
			path == "github.com/pandastack/pandastack/internal/contract/guestproto" ||
			path == "github.com/pandastack/pandastack/internal/contract/errs" ||
			strings.HasPrefix(path, "github.com/pandastack/pandastack/internal/contract/guestproto/")
	}
	for _, dir := range []string{".", "../contract/guestproto", "../contract/guestproto/guestprototest", "../contract/errs", "../contract/volproto", "../../cmd/panda-guest"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Errorf("no Go files in %s", dir)
		}
		for _, f := range files {
			ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatalf("parse %s: %v", f, err)
			}
			for _, imp := range ast.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				// Tests may use testkit's gates: it imports the standard
				// library only, and tests are not built into the agent.
				if strings.HasSuffix(f, "_test.go") && p == "github.com/pandastack/pandastack/internal/testing/testkit" {
					continue
				}
				if !allowed(p) {
					t.Errorf("%s imports %s; the guest side may import only the standard library, golang.org/x/sys, go-fuse, guestproto and volproto", f, p)
				}
			}
		}
	}
}
