package wire

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedIsCurrent runs generate.go's //go:generate command with its
// output (-o) into a temporary file and compares that with wire.gen.go, so that
// a change of api/openapi.yaml (or of the generator's settings) that was
// not regenerated fails here.
func TestGeneratedIsCurrent(t *testing.T) {
	src, err := os.ReadFile("generate.go")
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for line := range strings.Lines(string(src)) {
		if cmd, ok := strings.CutPrefix(strings.TrimSpace(line), "//go:generate "); ok {
			args = strings.Fields(cmd)
		}
	}
	if len(args) < 3 || args[0] != "go" || args[1] != "run" {
		t.Fatalf("generate.go's //go:generate line is %q: want go run oapi-codegen@VERSION ... -o wire.gen.go ...", args)
	}
	out := filepath.Join(t.TempDir(), "wire.gen.go")
	redirected := false
	for i := range args[:len(args)-1] {
		if args[i] == "-o" && args[i+1] == "wire.gen.go" {
			args[i+1], redirected = out, true
		}
	}
	if !redirected {
		t.Fatalf("generate.go's //go:generate line %q has no -o wire.gen.go", args)
	}
	args = args[1:]
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("wire.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("sdk/go/internal/wire/wire.gen.go is not what api/openapi.yaml generates: run `make generate` and commit it\n%s", firstDifference(got, want))
	}
}

// firstDifference describes the first line where the committed file
// (got) and the generated one (want) differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d:\n  committed: %s\n  generated: %s", i+1, gl, wl)
		}
	}
	return ""
}
