package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
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
			err := run(context.Background(), tt.args, &out, &errOut)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("run(%q) = %v, want error containing %q", tt.args, err, tt.wantErr)
			}
			if out.String() != tt.wantOut {
				t.Errorf("stdout = %q, want %q", out.String(), tt.wantOut)
			}
		})
	}
}
