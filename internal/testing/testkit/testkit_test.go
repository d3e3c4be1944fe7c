package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeT records what a gate does to a test instead of doing it.
type fakeT struct {
	testing.TB // nil: a call of another method panics
	fatal      string
	skip       string
}

func (f *fakeT) Helper()                        {}
func (f *fakeT) Fatal(args ...any)              { f.fatal = fmt.Sprint(args...) }
func (f *fakeT) Fatalf(format string, a ...any) { f.fatal = fmt.Sprintf(format, a...) }
func (f *fakeT) Skipf(format string, a ...any)  { f.skip = fmt.Sprintf(format, a...) }

func TestGates(t *testing.T) {
	t.Setenv("PANDA_TEST_IMAGES", filepath.Join(t.TempDir(), "none"))
	gates := map[string]func(testing.TB){
		"VM":       func(t testing.TB) { VM(t) },
		"Root":     Root,
		"Postgres": Postgres,
		"S3":       S3,
		"Slow":     func(t testing.TB) { Slow(t, "minutes") },
	}
	for name, gate := range gates {
		var f fakeT
		gate(&f)
		if testing.Short() {
			// Under -short every gate skips (Fatal is not reached: the
			// real Skipf ends the test).
			if f.skip == "" || !strings.Contains(f.skip, "-short") {
				t.Errorf("%s under -short: skip %q, want a skip naming -short", name, f.skip)
			}
			continue
		}
		if f.skip != "" {
			t.Errorf("%s without -short skipped (%q): gates fail, never skip", name, f.skip)
		}
	}
	if !testing.Short() {
		var f fakeT
		VM(&f)
		if !strings.Contains(f.fatal, "guest images missing") {
			t.Errorf("VM without images: fatal %q, want the images missing", f.fatal)
		}
	}
}

func TestImages(t *testing.T) {
	t.Setenv("PANDA_TEST_IMAGES", "")
	if got := Images(); got != DefaultImages {
		t.Errorf("Images() = %q, want %q", got, DefaultImages)
	}
	t.Setenv("PANDA_TEST_IMAGES", "/x")
	if got := Images(); got != "/x" {
		t.Errorf("Images() = %q, want /x", got)
	}
}

func TestPoll(t *testing.T) {
	t.Parallel()
	n := 0
	if !Poll(time.Minute, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("Poll of a condition true at the third call: n = %d", n)
	}
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Error("Poll of a condition never true reported true")
	}
}

func TestParseMountPoints(t *testing.T) {
	t.Parallel()
	table := `22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw
36 22 0:33 / /tmp/a\040b rw - tmpfs tmpfs rw
37 22 0:34 / /tmp/back\134slash rw - tmpfs tmpfs rw
`
	got := parseMountPoints(strings.NewReader(table))
	want := []string{"/", "/tmp/a b", `/tmp/back\slash`}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMountsOfThisProcess(t *testing.T) {
	t.Parallel()
	if !Mounted("/") || MountsAt("/") < 1 {
		t.Errorf("/ is not a mount point: %q", MountPoints())
	}
	for _, mp := range MountsUnder("/proc") {
		if !strings.HasPrefix(mp, "/proc/") {
			t.Errorf("MountsUnder(/proc) lists %s", mp)
		}
	}
}

func TestProcs(t *testing.T) {
	t.Parallel()
	me := os.Getpid()
	argv0, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	first := strings.SplitN(string(argv0), "\x00", 2)[0]
	if !slices.Contains(Procs(first+"\x00"), me) {
		t.Errorf("Procs(%q) misses this process %d", first, me)
	}
	if !Alive(me) {
		t.Error("this process is not Alive")
	}
	if Alive(1 << 30) {
		t.Error("a PID that cannot exist is Alive")
	}
	if OpenFDs(t) < 3 {
		t.Error("fewer than 3 open file descriptors")
	}
}

func TestSparse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	b := MakeSparse(t, p, 64<<20, 1, [2]int64{4096, 4096}, [2]int64{32 << 20, 100})
	if len(b) != 64<<20 || b[4095] != 0 || b[64<<20-1] != 0 {
		t.Fatalf("contents: %d bytes", len(b))
	}
	if a := Allocated(t, p); a >= 32<<20 {
		t.Errorf("a file of 4196 data bytes allocates %d bytes: holes were written", a)
	}
	CopySparse(t, p, p+".copy")
	if a := Allocated(t, p+".copy"); a >= 32<<20 {
		t.Errorf("the copy allocates %d bytes: holes were filled", a)
	}
	if FreeBytes(t, dir) <= 0 {
		t.Error("no free space where the test just wrote")
	}
}
