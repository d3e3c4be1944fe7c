package qemu

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

const defaultTBCacheMiB = 64

// The descriptors of the listening agent and QMP sockets and of the TAP
// device in QEMU (exec.Cmd.ExtraFiles start at 3).
const (
	agentFD = 3
	qmpFD   = 4
	tapFD   = 5
)

// paths are the paths of a machine's files as its QEMU sees them: the
// host's, or the jail's.
type paths struct {
	disk, mem, kernel, initrd, console string
}

func hostPaths(spec vmm.Spec) paths {
	return paths{spec.Disk, spec.MemoryFile, spec.Kernel, spec.Initramfs, spec.ConsoleLog}
}

func jailPaths(spec vmm.Spec) paths {
	p := paths{jailDisk, jailMem, jailKernel, jailInitrd, ""}
	if spec.ConsoleLog != "" {
		p.console = jailConsole
	}
	return p
}

// nameArg is the -name of the machine whose host run directory is runDir:
// it identifies the process for Adopt, whatever paths it sees.
func nameArg(runDir string) string {
	return "guest=panda:" + qemuEscape(runDir) + ",debug-threads=on"
}

// runDirOf is the host run directory named in a VMM's command line
// (see nameArg), or "".
func runDirOf(cmdline []byte) string {
	args := strings.Split(string(cmdline), "\x00")
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-name" {
			continue
		}
		v, ok := strings.CutPrefix(args[i+1], "guest=panda:")
		if v, ok2 := strings.CutSuffix(v, ",debug-threads=on"); ok && ok2 {
			return strings.ReplaceAll(v, ",,", ",")
		}
	}
	return ""
}

// args builds the QEMU command line for spec, with its files at p.
func (d *Driver) args(spec vmm.Spec, p paths) ([]string, error) {
	if spec.MemoryMiB <= 0 {
		return nil, fmt.Errorf("memory must be positive, got %d MiB", spec.MemoryMiB)
	}
	if spec.VCPUs <= 0 {
		spec.VCPUs = 1
	}
	accelArg := ""
	switch spec.Accel {
	case accel.KVM:
		accelArg = "kvm"
	case accel.TCG:
		tb := spec.TBCacheMiB
		if tb <= 0 {
			tb = defaultTBCacheMiB
		}
		accelArg = fmt.Sprintf("tcg,thread=multi,tb-size=%d", tb)
	default:
		return nil, fmt.Errorf("accel %q must be resolved to kvm or tcg before start", spec.Accel)
	}
	share := "off"
	if spec.MemoryShared {
		share = "on"
	}
	prealloc := "off"
	if spec.Prealloc {
		prealloc = "on"
	}
	pit := "on"
	switch spec.Machine {
	case vmm.MachineLegacy:
	case vmm.MachineNoPIT:
		pit = "off"
	default:
		return nil, fmt.Errorf("unknown machine layout %q (made by a newer PandaStack?)", spec.Machine)
	}
	console := "null"
	if p.console != "" {
		console = "file:" + p.console
	}
	a := []string{
		"-name", nameArg(spec.RunDir),
		// mem-merge=off and merge=off: no KSM on guest RAM (pages merged
		// across guests leak through timing and cost a scan).
		"-machine", "microvm,acpi=on,pit=" + pit + ",pic=on,rtc=on,isa-serial=on,memory-backend=mem,mem-merge=off",
		"-accel", accelArg,
		"-cpu", cpuModel(spec.Accel),
		"-m", fmt.Sprintf("%dM", spec.MemoryMiB),
		"-smp", strconv.Itoa(spec.VCPUs),
		"-object", fmt.Sprintf("memory-backend-file,id=mem,size=%dM,mem-path=%s,share=%s,prealloc=%s,discard-data=off,merge=off",
			spec.MemoryMiB, qemuEscape(p.mem), share, prealloc),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", console,
		"-drive", fmt.Sprintf("id=vda,file=%s,format=raw,if=none,cache=writeback,discard=unmap,detect-zeroes=unmap", qemuEscape(p.disk)),
		"-device", "virtio-blk-device,drive=vda",
		"-device", "virtio-serial-device,max_ports=2",
		// Both sockets are the host's, bound in the run directory before
		// the start and passed as listening descriptors: QEMU never needs
		// to create a file.
		"-chardev", fmt.Sprintf("socket,id=agent,fd=%d,server=on,wait=off", agentFD),
		"-device", "virtserialport,chardev=agent,name=panda",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", qmpFD),
		"-mon", "chardev=qmp,mode=control",
		"-global", "migration.send-configuration=off",
		// No self-announce after an incoming migration: QEMU would have
		// the guest send gratuitous ARPs (virtio-net's guest announce)
		// several times over ~1 s after every restore — guest work right
		// when the first command runs (~900 translation blocks under
		// TCG). A sandbox's TAP is its own: no switch has to relearn
		// where its MAC address lives.
		"-global", "migration.announce-rounds=0",
	}
	if spec.Net != nil {
		mac, err := parseMAC(spec.Net.MAC)
		if err != nil {
			return nil, err
		}
		// The TAP is the caller's, passed as a descriptor: QEMU runs no
		// script and needs no privilege. No vhost: it would need
		// /dev/vhost-net in the jail and works only under KVM.
		a = append(a,
			"-netdev", fmt.Sprintf("tap,id=net0,fd=%d,vhost=off", tapFD),
			"-device", "virtio-net-device,netdev=net0,mac="+mac.String())
	}
	if !d.cfg.NoSandbox {
		a = append(a, "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny")
	}
	if spec.Incoming {
		// A restore never runs the firmware or the kernel loader: guest
		// RAM comes from the memory file. Not loading 20 MB of kernel and
		// initramfs into fw_cfg saves ~20 ms of every start.
		a = append(a, "-incoming", "defer", "-S")
	} else {
		a = append(a, "-kernel", p.kernel, "-initrd", p.initrd, "-append", spec.Cmdline)
	}
	return append(a, d.cfg.ExtraArgs...), nil
}

// parseMAC parses the MAC address of a guest's NIC: six bytes, unicast.
func parseMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 {
		return nil, fmt.Errorf("network interface: %q is not a unicast MAC address", s)
	}
	return mac, nil
}

func cpuModel(a accel.Accel) string {
	if a == accel.KVM {
		return "host"
	}
	return "max"
}

// qemuEscape doubles commas, QEMU's option-value escape.
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

func agentSocket(runDir string) string { return filepath.Join(runDir, "agent.sock") }

func qmpSocket(runDir string) string { return filepath.Join(runDir, "qmp.sock") }

// PIDFile is where Start records the VMM's PID inside the run directory, so
// that a restarted host agent can find and adopt it.
func PIDFile(runDir string) string { return filepath.Join(runDir, "vmm.pid") }
