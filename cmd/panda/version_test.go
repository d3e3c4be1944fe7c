package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "panda-guest")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n[ \"$1\" = --version ] && echo v9.8.7-test\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	writeVersion(context.Background(), &buf, []string{filepath.Join(dir, "missing"), fake})
	got := buf.String()
	for _, want := range []string{"panda " + version + "\n", "go " + runtime.Version(), "guest agent v9.8.7-test (" + fake + ")\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("version output %q lacks %q", got, want)
		}
	}

	buf.Reset()
	writeVersion(context.Background(), &buf, []string{filepath.Join(dir, "missing")})
	if got, want := buf.String(), "guest agent unknown\n"; !strings.HasSuffix(got, want) {
		t.Errorf("with no guest agent: got %q, want suffix %q", got, want)
	}
}

func TestVersionCommands(t *testing.T) {
	t.Setenv("PANDA_DATA_DIR", t.TempDir())
	for _, args := range [][]string{{"--version"}, {"version"}} {
		var out, errb bytes.Buffer
		if err := run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("panda %v: %v", args, err)
		}
		if got := out.String(); !strings.HasPrefix(got, "panda "+version+"\ngo ") {
			t.Errorf("panda %v printed %q", args, got)
		}
	}
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"no-such-verb"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("panda no-such-verb: got %v, want unknown command", err)
	}
}
