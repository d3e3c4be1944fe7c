package nettest

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// envMountChild marks the re-executed test binary of
// TestRemoveAfterNetnsDirMounted.
const envMountChild = "PANDA_NETTEST_MOUNT_CHILD"

// TestRemoveAfterNetnsDirMounted: a namespace CreateNS made before the
// network manager made /run/netns a mount point of its own is still
// removed whole. (It used to be bound on /run, then hidden under that
// mount, where no path reached it: its file stayed "busy" until a reboot,
// after `panda dev cluster` and the network tests.) It runs in a child
// process with a mount namespace of its own over an empty /run, so that
// nothing of it reaches the machine's mounts.
func TestRemoveAfterNetnsDirMounted(t *testing.T) {
	if os.Getenv(envMountChild) != "" {
		removeAfterNetnsDirMounted(t)
		return
	}
	testkit.Root(t) // mounts, network namespaces
	cmd := exec.Command(os.Args[0], "-test.run=^TestRemoveAfterNetnsDirMounted$", "-test.v")
	cmd.Env = append(os.Environ(), envMountChild+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("in a mount namespace of its own: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestRemoveAfterNetnsDirMounted") {
		t.Fatalf("the child ran no test:\n%s", out)
	}
}

func removeAfterNetnsDirMounted(t *testing.T) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make / private: %v", err)
	}
	if err := unix.Mount("tmpfs", "/run", "tmpfs", 0, "mode=0755"); err != nil {
		t.Fatalf("mount an empty /run: %v", err)
	}
	ns, err := CreateNS("ntmnt-a")
	if err != nil {
		t.Fatal(err)
	}
	// What a network manager does when it opens.
	if err := network.EnsureNetnsDir(); err != nil {
		t.Fatal(err)
	}
	ns.Remove()
	if _, err := os.Stat(ns.Path); !os.IsNotExist(err) {
		t.Errorf("%s after Remove: %v, want it gone", ns.Path, err)
	}
	if m := testkit.MountsAt(ns.Path); m != 0 {
		t.Errorf("%d mounts left at %s", m, ns.Path)
	}
}
