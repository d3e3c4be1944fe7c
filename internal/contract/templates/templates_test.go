package templates

import (
	"errors"
	"strings"
	"testing"
)

// ParamsOfKey is Key's inverse, given the memory and vCPUs.
func TestParamsOfKey(t *testing.T) {
	for _, p := range []Params{{Name: "base", MemoryMiB: 1024, VCPUs: 1}, {Name: "my-app_2", MemoryMiB: 512, VCPUs: 4}, {Name: "my-app:3", MemoryMiB: 256, VCPUs: 1}, {Name: "a-1m-1c", MemoryMiB: 128, VCPUs: 2}} {
		got, ok := ParamsOfKey(p.Key(), p.MemoryMiB, p.VCPUs)
		if !ok || got != p {
			t.Errorf("ParamsOfKey(%q, %d, %d) = %+v, %v; want %+v", p.Key(), p.MemoryMiB, p.VCPUs, got, ok, p)
		}
	}
	for _, c := range []struct {
		key       string
		mem, cpus int
	}{
		{"base-1024m-1c", 512, 1},     // another size
		{"base-1024m-1c", 1024, 2},    // other vCPUs
		{"-1024m-1c", 1024, 1},        // no name
		{"Base-1024m-1c", 1024, 1},    // not a name
		{"app.v0-256m-1c", 256, 1},    // no version 0
		{"app.vx-256m-1c", 256, 1},    // not a version
		{"base-64m-1c", 64, 1},        // too little memory
		{"app.v3.v4-256m-1c", 256, 1}, // two versions
	} {
		if p, ok := ParamsOfKey(c.key, c.mem, c.cpus); ok {
			t.Errorf("ParamsOfKey(%q, %d, %d) = %+v, want none", c.key, c.mem, c.cpus, p)
		}
	}
}

func TestStartupValidate(t *testing.T) {
	for _, tc := range []struct {
		su Startup
		ok bool
	}{
		{Startup{}, true},
		{Startup{StartCmd: "exec server"}, true},
		{Startup{StartCmd: "exec server", ReadyCmd: "check", ReadyTimeoutSeconds: 120}, true},
		{Startup{ReadyCmd: "check"}, true},
		{Startup{StartCmd: "x", ReadyTimeoutSeconds: 10}, false}, // a timeout without a ready command
		{Startup{ReadyCmd: "check", ReadyTimeoutSeconds: -1}, false},
		{Startup{ReadyCmd: "check", ReadyTimeoutSeconds: 31 * 60}, false},
		{Startup{StartCmd: strings.Repeat("x", MaxStartupCmdBytes+1)}, false},
		{Startup{ReadyCmd: "a\x00b"}, false},
	} {
		err := tc.su.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("Validate(%+v) = %v, want ok %v", tc.su, err, tc.ok)
		}
	}
}
