package bench

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestIsVCPUThread(t *testing.T) {
	for comm, want := range map[string]bool{
		"CPU 0/TCG": true, "CPU 12/KVM": true,
		"qemu-system-x86": false, "CPU 0/": false, "CPU x/TCG": false, "CPU 0": false, "vCPU 0/TCG": false,
	} {
		if got := isVCPUThread(comm); got != want {
			t.Errorf("isVCPUThread(%q) = %v, want %v", comm, got, want)
		}
	}
}

// TestVMMCPU: a thread of this process named as QEMU names a vCPU thread
// burns CPU; vmmCPU counts at least that for the vCPU, and the whole
// process at least as much.
func TestVMMCPU(t *testing.T) {
	const burn = 150 * time.Millisecond
	ready, done := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		name, _ := unix.BytePtrFromString("CPU 0/TCG")
		if err := unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0); err != nil {
			ready <- err
			return
		}
		self := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/schedstat"
		for {
			ns, err := taskRunNS(self)
			if err != nil {
				ready <- err
				return
			}
			if time.Duration(ns) >= burn {
				break
			}
			for i := 0; i < 1e6; i++ { // spin
			}
		}
		ready <- nil
		<-done
	}()
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	defer close(done)
	c, err := vmmCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if c.VCPU < burn {
		t.Errorf("vCPU time %v, want at least %v", c.VCPU, burn)
	}
	// The process's time is charged a clock tick at a time to whichever
	// thread the tick finds running: it may miss a few ticks of the
	// burn (it missed 10.3 ms of 60 once), never most of it.
	if slack := 3 * time.Second / clockTicks; c.All+slack < c.VCPU {
		t.Errorf("whole process %v, less than its vCPU thread's %v (by more than %v)", c.All, c.VCPU, slack)
	}
}
