package template_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
)

// validNameRef is the contract of a template reference, written out byte
// by byte: a name of 1 to 32 characters of lowercase ASCII letters,
// digits, - and _, the first a letter or a digit, optionally pinned to a
// version, ":V" with V from 1 to 1e9 written without leading zeros (user
// templates' versions). Names become file and directory names.
func validNameRef(ref string) bool {
	name, v, pinned := strings.Cut(ref, ":")
	if pinned {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1e9 || strconv.Itoa(n) != v {
			return false
		}
	}
	if len(name) < 1 || len(name) > 32 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_') {
			return false
		}
	}
	return true
}

// FuzzParamsValidate holds Params.Validate to its contract for any name
// and shape: it accepts exactly the valid ones, rejects the others with
// ErrInvalid, and a valid template's directory (Key) and root filesystem
// are single path components that map back to one set of parameters.
func FuzzParamsValidate(f *testing.F) {
	seeds := []templates.Params{
		{Name: "base", MemoryMiB: 1024, VCPUs: 1},
		{Name: "tiny", MemoryMiB: 256, VCPUs: 2},
		{Name: "a", MemoryMiB: templates.MinMemoryMiB, VCPUs: 1},
		{Name: strings.Repeat("z", 32), MemoryMiB: templates.MaxMemoryMiB, VCPUs: templates.MaxVCPUs},
		{Name: strings.Repeat("z", 33), MemoryMiB: 512, VCPUs: 1},
		{Name: "x-128m-1c", MemoryMiB: 128, VCPUs: 1},
		{Name: "0_a-b", MemoryMiB: 4096, VCPUs: 4},
		{Name: "app:3", MemoryMiB: 512, VCPUs: 1},
		{Name: "app:03", MemoryMiB: 512, VCPUs: 1},
		{Name: "app:0", MemoryMiB: 512, VCPUs: 1},
		{Name: "app:", MemoryMiB: 512, VCPUs: 1},
		{Name: "", MemoryMiB: 512, VCPUs: 1},
		{Name: "-a", MemoryMiB: 512, VCPUs: 1},
		{Name: "_a", MemoryMiB: 512, VCPUs: 1},
		{Name: "A", MemoryMiB: 512, VCPUs: 1},
		{Name: "../etc", MemoryMiB: 512, VCPUs: 1},
		{Name: "a/b", MemoryMiB: 512, VCPUs: 1},
		{Name: "a\n", MemoryMiB: 512, VCPUs: 1},
		{Name: "a\x00", MemoryMiB: 512, VCPUs: 1},
		{Name: "é", MemoryMiB: 512, VCPUs: 1},
		{Name: "base", MemoryMiB: templates.MinMemoryMiB - 1, VCPUs: 1},
		{Name: "base", MemoryMiB: templates.MaxMemoryMiB + 1, VCPUs: 1},
		{Name: "base", MemoryMiB: -1 << 63, VCPUs: -1},
		{Name: "base", MemoryMiB: 512, VCPUs: 0},
		{Name: "base", MemoryMiB: 512, VCPUs: templates.MaxVCPUs + 1},
		{Name: "base", MemoryMiB: 1<<63 - 1, VCPUs: 1<<63 - 1},
	}
	for _, p := range seeds {
		f.Add(p.Name, p.MemoryMiB, p.VCPUs)
	}
	f.Fuzz(func(t *testing.T, name string, memoryMiB, vcpus int) {
		p := templates.Params{Name: name, MemoryMiB: memoryMiB, VCPUs: vcpus}
		err := p.Validate()
		want := validNameRef(name) &&
			templates.MinMemoryMiB <= memoryMiB && memoryMiB <= templates.MaxMemoryMiB &&
			1 <= vcpus && vcpus <= templates.MaxVCPUs
		if (err == nil) != want {
			t.Fatalf("%+v: Validate() = %v, want valid = %v", p, err, want)
		}
		if err != nil {
			if !errors.Is(err, templates.ErrInvalid) {
				t.Fatalf("%+v: Validate() = %v, not templates.ErrInvalid", p, err)
			}
			return
		}
		key := p.Key()
		if filepath.Base(key) != key || strings.HasPrefix(key, ".") {
			t.Fatalf("%+v: Key() = %q is not one plain path component", p, key)
		}
		if got, err := parseKey(key); err != nil || got != p {
			t.Fatalf("%+v: Key() = %q parses back as %+v (%v): two shapes could share a directory", p, key, got, err)
		}
		images := template.Images{Dir: "/images"}
		if rootfs := images.RootFS(name); filepath.Dir(rootfs) != "/images" {
			t.Fatalf("%+v: RootFS = %q, outside the images directory", p, rootfs)
		}
	})
}

// parseKey inverts Params.Key ("NAME-MEMm-VCPUSc", NAME:V written
// NAME.vV: names have no dot), reading from the right.
func parseKey(key string) (templates.Params, error) {
	var p templates.Params
	rest, c, ok := cutLast(key, "-")
	if !ok || !strings.HasSuffix(c, "c") {
		return p, fmt.Errorf("no -VCPUSc in %q", key)
	}
	rest, m, ok := cutLast(rest, "-")
	if !ok || !strings.HasSuffix(m, "m") {
		return p, fmt.Errorf("no -MEMm in %q", key)
	}
	var err1, err2 error
	p.Name = rest
	if n, v, ok := strings.Cut(rest, ".v"); ok {
		p.Name = n + ":" + v
	}
	p.MemoryMiB, err1 = strconv.Atoi(strings.TrimSuffix(m, "m"))
	p.VCPUs, err2 = strconv.Atoi(strings.TrimSuffix(c, "c"))
	return p, errors.Join(err1, err2)
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
