package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
)

// ProbeKVM reports whether KVM can actually run a guest here: opening
// /dev/kvm proves nothing (a nested PVM host accepts the open but never gets
// a stock kernel past its decompressor). It boots kernel with no init under
// -accel kvm and waits up to timeout for the kernel's final panic message
// on the serial console, which only a kernel that booted completely prints.
// The reason says why KVM is not usable, in words for a log line at start:
// what QEMU wrote to its standard error (an assertion on some nested
// hosts) is logged at debug level, never in the reason.
func (d *Driver) ProbeKVM(ctx context.Context, kernel string, timeout time.Duration) (ok bool, reason string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("open /dev/kvm: %v", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	const memMiB = 128
	kernelArg := kernel
	if !d.cfg.NoConfine {
		kernelArg = jailKernel
	}
	cmd := exec.CommandContext(ctx, d.cfg.Binary,
		"-machine", "microvm,acpi=off,pit=on,pic=on,rtc=on,isa-serial=on",
		"-accel", "kvm", "-cpu", "host", "-m", fmt.Sprintf("%dM", memMiB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio", "-kernel", kernelArg,
		"-append", "console=ttyS0 panic=-1 rdinit=/panda-kvm-probe-no-init root=/dev/panda-none",
	)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return false, err.Error()
	}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedBuffer{buf: &stderr, max: 4 << 10}
	// Confined like every VMM: a kernel that can boot under KVM here must
	// also boot as an unprivileged user with only /dev/kvm of its own.
	b, err := d.spawn(cmd, confinement{
		limits: d.limits(memMiB, 1),
		files:  []jailFile{{host: kernel, jail: jailKernel}},
		kvm:    true,
		fsize:  0, // it writes no file
	})
	if err != nil {
		return false, fmt.Sprintf("start qemu: %v", err)
	}
	defer func() {
		if b != nil {
			b.release()
		}
	}()
	defer cmd.Wait()
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte("Kernel panic")) {
			return true, ""
		}
	}
	if ctx.Err() != nil {
		return false, fmt.Sprintf("a guest kernel did not finish booting under KVM within %s", timeout)
	}
	// QEMU gave up (on some nested hosts it cannot even set the vCPU's
	// MSRs, and fails an assertion; without /dev/kvm it cannot open the
	// module).
	cmd.Process.Kill()
	cmd.Wait() // collects stderr; the deferred Wait then does nothing
	msg := cleanStderr(stderr.String())
	if msg == "" {
		return false, "a guest kernel did not boot under KVM"
	}
	d.cfg.Logger.Debug("kvm probe: qemu exited", "stderr", msg)
	if strings.Contains(msg, "Could not access KVM kernel module") {
		return false, "qemu could not open /dev/kvm"
	}
	return false, "qemu exited before a guest kernel booted under KVM (its error output is logged at debug level)"
}

// TSCkHz implements vmm.Driver: the package's TSCkHz.
func (d *Driver) TSCkHz() int { return TSCkHz() }

// ResolveAccel turns auto into kvm or tcg, probing with kernel. cache, if
// not empty, is a file that remembers the answer for this kernel so that the
// probe runs once per host.
func (d *Driver) ResolveAccel(ctx context.Context, want accel.Accel, kernel, cache string) (accel.Accel, string, error) {
	switch want {
	case accel.KVM, accel.TCG:
		return want, "configured", nil
	case accel.Auto, "":
	default:
		return "", "", fmt.Errorf("unknown accel %q (want auto, kvm or tcg)", want)
	}
	st, err := os.Stat(kernel)
	if err != nil {
		return "", "", fmt.Errorf("probe kvm: %w", err)
	}
	key := fmt.Sprintf("%s %d %d", kernel, st.Size(), st.ModTime().UnixNano())
	if cache != "" {
		if b, err := os.ReadFile(cache); err == nil {
			k, v, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
			if k == key && (v == "kvm" || v == "tcg") {
				return accel.Accel(v), "cached probe result", nil
			}
		}
	}
	ok, reason := d.ProbeKVM(ctx, kernel, 5*time.Second)
	got := accel.TCG
	if ok {
		got, reason = accel.KVM, "kvm boots a guest"
	}
	if cache != "" {
		os.WriteFile(cache, []byte(key+"\n"+string(got)+"\n"), 0o644)
	}
	return got, reason, nil
}

// TSCkHz returns the host's TSC frequency in kHz, or 0 if unknown. Under TCG
// the guest reads the host's TSC, and telling the guest kernel its
// frequency (tsc_early_khz=) avoids a calibration that can hang under
// emulation.
func TSCkHz() int {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			return v
		}
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil && f > 0 {
				return int(f * 1000)
			}
		}
	}
	return 0
}
