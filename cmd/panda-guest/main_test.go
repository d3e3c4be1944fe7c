package main

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		stdin   string
		wantOut string
		wantErr string
	}{
		{name: "version", args: []string{"-version"}, wantOut: "dev\n"},
		{name: "bad flag", args: []string{"-nope"}, wantErr: "flag provided but not defined"},
		{name: "missing port", args: []string{"-port", "/nonexistent/vport9p9"}, wantErr: "open port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, strings.NewReader(tt.stdin), &out, &errOut)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("run(%q) = %v, want error containing %q", tt.args, err, tt.wantErr)
			}
			if out.String() != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out.String(), tt.wantOut)
			}
		})
	}
}

// The extract and sync subcommands (run as execs in the guest).
func TestSubcommands(t *testing.T) {
	root := t.TempDir()
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	tw.WriteHeader(&tar.Header{Name: "d/f", Mode: 0o640, Size: 2, Typeflag: tar.TypeReg})
	tw.Write([]byte("hi"))
	tw.Close()
	owner := strconv.Itoa(os.Getuid()) + ":" + strconv.Itoa(os.Getgid())
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"extract", "--root", root, "--chown", owner}, &tarball, &out, &errOut); err != nil {
		t.Fatalf("extract: %v (%s)", err, errOut.String())
	}
	if st, err := os.Stat(filepath.Join(root, "d/f")); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("extracted d/f: %v, %v; want mode 0640", st, err)
	}
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"extract", "--root", root, "--chown", "nosuch"}, `user "nosuch" not found`},
		{[]string{"extract", "--root", root, "extra"}, "unexpected arguments"},
		{[]string{"sync", "x"}, "unexpected arguments"},
		{[]string{"sync"}, ""},
	} {
		err := run(context.Background(), tc.args, strings.NewReader(""), &out, &errOut)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("run(%q) = %v, want error containing %q", tc.args, err, tc.wantErr)
		}
	}
}
