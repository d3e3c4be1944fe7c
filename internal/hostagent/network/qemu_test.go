package network_test

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestQEMUTakesTapFD: QEMU accepts a TapFD as `-netdev tap,fd=3` on a
// virtio-net device of a microvm (it reads the TAP's flags, vnet_hdr
// included, and sets its offloads), holds the TAP's one queue while it
// runs and frees it when it exits. No guest boots (-S): the data path is
// tested with nettest.Guest until the guest has a NIC.
func TestQEMUTakesTapFD(t *testing.T) {
	testkit.VM(t)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	env := nettest.NewEnv(t)
	m := newManager(t, env, network.Config{})
	ns, err := m.Acquire(ctxT(t, 10*time.Second), netpolicy.Default())
	if err != nil {
		t.Fatal(err)
	}
	f, err := ns.TapFD()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(qemu, "-machine", "microvm,acpi=off", "-accel", "tcg", "-m", "64M",
		"-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-netdev", "tap,id=n0,fd=3",
		"-device", "virtio-net-device,netdev=n0,mac="+network.GuestMAC.String(),
		"-qmp", "stdio")
	cmd.ExtraFiles = []*os.File{f}
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close() // QEMU has its copy
	exited := false
	defer func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	greeting := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		greeting <- l
	}()
	select {
	case l := <-greeting:
		if !strings.Contains(l, "QMP") {
			t.Fatalf("QEMU did not start with the TAP: %q; stderr: %s", l, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no QMP greeting; stderr: %s", stderr.String())
	}
	if _, err := ns.TapFD(); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("TapFD while QEMU holds the TAP: %v, want EBUSY", err)
	}
	stdin.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n" + `{"execute":"quit"}` + "\n"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("QEMU quit: %v; stderr: %s", err, stderr.String())
	}
	exited = true
	f2, err := ns.TapFD()
	if err != nil {
		t.Fatalf("TapFD after QEMU exited: %v", err)
	}
	f2.Close()
}
