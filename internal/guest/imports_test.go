package guest_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestGuestImportsNoHostCode enforces that the guest agent and the protocol
// it shares with the host depend on the standard library, golang.org/x/sys
// and each other only.
func TestGuestImportsNoHostCode(t *testing.T) {
	allowed := func(path string) bool {
		first, _, _ := strings.Cut(path, "/")
		return !strings.Contains(first, ".") ||
			strings.HasPrefix(path, "golang.org/x/sys/") ||
			path == "github.com/pandastack/pandastack/internal/guest" ||
			path == "github.com/pandastack/pandastack/internal/contract/guestproto" ||
			strings.HasPrefix(path, "github.com/pandastack/pandastack/internal/contract/guestproto/")
	}
	for _, dir := range []string{".", "../contract/guestproto", "../contract/guestproto/guestprototest", "../../cmd/panda-guest"} {
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
				if p := strings.Trim(imp.Path.Value, `"`); !allowed(p) {
					t.Errorf("%s imports %s; the guest side may import only the standard library, golang.org/x/sys and guestproto", f, p)
				}
			}
		}
	}
}
