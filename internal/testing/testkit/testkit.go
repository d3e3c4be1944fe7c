// Package testkit is what PandaStack's tests share: the gates that say what
// a test needs beyond the Go toolchain, and the helpers every package used
// to copy (the guest images directory, polling with a deadline, the /proc
// and mountinfo scanners, sparse files, free space).
//
// # Gates
//
// A test that needs a guest VM, root, PostgreSQL or an S3 server starts
// with the gate of that need:
//
//	func TestFork(t *testing.T) {
//		images := testkit.VM(t)
//		...
//
// Under `go test -short` (`make unit`) a gate skips the test: the fast tier
// runs every test that needs none of them. Without -short (`make test`, CI)
// a gate checks what the test needs and fails the test, never skips it,
// when that is missing: a suite that skips by default hides regressions.
// Heavy shared setup (a host agent with a baked template, a server) is made
// on first use by a test that passed its gate (a sync.Once behind the
// package's own helper), never eagerly in TestMain.
//
// pgtest.Start and s3test.Start pass the Postgres and S3 gates themselves.
//
// It imports only the standard library and golang.org/x/sys, so that any
// test, the Go SDK's included, may use it.
package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// DefaultImages is the guest images directory `make setup` fills.
const DefaultImages = "/var/lib/pandastack/images"

// Images is the guest images directory of tests: $PANDA_TEST_IMAGES, or
// DefaultImages.
func Images() string {
	if d := os.Getenv("PANDA_TEST_IMAGES"); d != "" {
		return d
	}
	return DefaultImages
}

// skipShort skips t under -short, saying what the test needs.
func skipShort(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: skipped with -short", needs)
	}
}

// VM gates a test that boots guests (QEMU under TCG): under -short it
// skips the test; otherwise it fails it unless the guest images (kernel,
// the tiny root filesystem) and qemu-system-x86_64 are there. It returns
// the images directory.
func VM(t testing.TB) string {
	t.Helper()
	skipShort(t, "guest VMs")
	if err := CheckVM(); err != nil {
		t.Fatal(err)
	}
	return Images()
}

// CheckVM reports what is missing to boot guests: the guest images or
// QEMU. Package-wide setup that has no test to gate (a benchmark's) uses
// it; tests use VM.
func CheckVM() error {
	dir := Images()
	for _, f := range []string{"kernel/vmlinuz", "rootfs-tiny.ext4"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("guest images missing (run make setup, or set PANDA_TEST_IMAGES): %v", err)
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return fmt.Errorf("QEMU missing (run make setup): %v", err)
	}
	return nil
}

// Root gates a test that needs root (mounts, network namespaces, FUSE,
// other users' files, confined VMMs): under -short it skips the test;
// otherwise it fails it unless the test runs as root.
func Root(t testing.TB) {
	t.Helper()
	skipShort(t, "root")
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (make test runs as root)")
	}
}

// Postgres gates a test that runs a PostgreSQL server: under -short it
// skips the test. pgtest.Start passes this gate and then fails the test
// when PostgreSQL is not installed.
func Postgres(t testing.TB) {
	t.Helper()
	skipShort(t, "PostgreSQL")
}

// S3 gates a test that runs an S3 server (versitygw): under -short it
// skips the test. s3test.Start passes this gate and then fails the test
// when the server's binary is missing.
func S3(t testing.TB) {
	t.Helper()
	skipShort(t, "an S3 server")
}

// Slow gates a test that needs none of the above but runs real processes
// for minutes (a whole `panda up`, a dev cluster, the image builds): under
// -short it skips the test. why says what makes it slow.
func Slow(t testing.TB, why string) {
	t.Helper()
	skipShort(t, why)
}
