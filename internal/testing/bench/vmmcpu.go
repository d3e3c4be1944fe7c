package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// VMMCPU is the CPU time a VMM process has used since it started.
type VMMCPU struct {
	// VCPU is its vCPU threads' (QEMU names them "CPU n/TCG" or
	// "CPU n/KVM"): the guest's own work, and under TCG the translation
	// of every guest instruction it runs for the first time in this
	// process. A vCPU runs the guest one instruction stream at a time, so
	// for a one-vCPU guest this is a floor under any latency that waits
	// for the guest.
	VCPU time.Duration
	// All is every thread's, also those that have exited (clock-tick
	// resolution: 10 ms).
	All time.Duration
}

// vmmCPU reads process pid's CPU time from /proc.
func vmmCPU(pid int) (VMMCPU, error) {
	var c VMMCPU
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	c.All = time.Duration(procTicks(pid)) * time.Second / clockTicks
	tasks, err := os.ReadDir(filepath.Join(dir, "task"))
	if err != nil {
		return c, fmt.Errorf("vmm cpu: %w", err)
	}
	for _, t := range tasks {
		comm, err := os.ReadFile(filepath.Join(dir, "task", t.Name(), "comm"))
		if err != nil || !isVCPUThread(strings.TrimSpace(string(comm))) {
			continue // gone meanwhile, or not a vCPU
		}
		ns, err := taskRunNS(filepath.Join(dir, "task", t.Name(), "schedstat"))
		if err != nil {
			return c, fmt.Errorf("vmm cpu: %w", err)
		}
		c.VCPU += time.Duration(ns)
	}
	return c, nil
}

// isVCPUThread tells a QEMU vCPU thread by its name: "CPU 0/TCG",
// "CPU 1/KVM".
func isVCPUThread(comm string) bool {
	rest, ok := strings.CutPrefix(comm, "CPU ")
	n, accel, found := strings.Cut(rest, "/")
	if !ok || !found || accel == "" {
		return false
	}
	_, err := strconv.Atoi(n)
	return err == nil
}

// taskRunNS is the time a thread has spent on a CPU, in nanoseconds: the
// first field of its schedstat.
func taskRunNS(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("%s is empty", path)
	}
	return strconv.ParseUint(f[0], 10, 64)
}
