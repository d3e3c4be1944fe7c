package guest

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Hooks are the restore hooks the agent runs on every HELLO, before it
// acknowledges, so that each restored copy of a snapshot gets the current
// time, its own kernel RNG state and its own identity before any user
// command runs. Implementations are called from one goroutine at a time.
type Hooks interface {
	// SetClock sets the wall clock.
	SetClock(t time.Time) error
	// AddEntropy mixes seed into the kernel RNG and forces a reseed, so
	// clones of one snapshot stop producing identical random bytes.
	AddEntropy(seed []byte) error
	// SetHostname sets the kernel hostname and /etc/hostname, and maps
	// the name to 127.0.1.1 in /etc/hosts.
	SetHostname(name string) error
	// SetMachineID writes /etc/machine-id.
	SetMachineID(id string) error
}

// SystemHooks changes the real system. Only the guest uses it: on a host it
// would set the host's clock and hostname.
type SystemHooks struct {
	// EtcDir is where hostname and machine-id are written; "" means /etc.
	EtcDir string
	// RunDir is where the identity files really live when EtcDir's are
	// symlinks into it (see LinkIdentityFiles); "" means /run/panda.
	RunDir string
}

var _ Hooks = SystemHooks{}

// SetClock sets CLOCK_REALTIME.
func (SystemHooks) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	return nil
}

// AddEntropy feeds seed through RNDADDENTROPY (crediting it) and then asks
// for a CRNG reseed with RNDRESEEDCRNG.
func (SystemHooks) AddEntropy(seed []byte) error {
	fd, err := unix.Open("/dev/urandom", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/urandom: %w", err)
	}
	defer unix.Close(fd)
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(info[0:4], uint32(len(seed)*8))
	binary.NativeEndian.PutUint32(info[4:8], uint32(len(seed)))
	copy(info[8:], seed)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0]))); errno != 0 {
		return fmt.Errorf("add entropy: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("reseed crng: %w", errno)
	}
	return nil
}

// SetHostname sets the kernel hostname, writes /etc/hostname and maps the
// name to 127.0.1.1 in /etc/hosts (Debian's convention), so that a program
// resolving its own host name (sudo, hostname -f, Java's getLocalHost)
// finds it without asking the DNS server, which does not know it.
func (h SystemHooks) SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	if err := h.writeIdentity("hostname", []byte(name+"\n"), 0o644); err != nil {
		return err
	}
	return h.mapHostname(name)
}

// hostnameAddr is the address /etc/hosts gives the sandbox's own name.
const hostnameAddr = "127.0.1.1"

// mapHostname replaces the lines of /etc/hosts for hostnameAddr with one
// that maps it to name, keeping every other line.
func (h SystemHooks) mapHostname(name string) error {
	old, err := os.ReadFile(filepath.Join(h.etc(), "hosts"))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read hosts: %w", err)
	}
	var b strings.Builder
	if len(old) == 0 {
		b.WriteString("127.0.0.1\tlocalhost\n")
	}
	for _, line := range strings.SplitAfter(string(old), "\n") {
		if f := strings.Fields(line); line == "" || len(f) > 0 && f[0] == hostnameAddr {
			continue
		}
		b.WriteString(line)
		if !strings.HasSuffix(line, "\n") {
			b.WriteString("\n")
		}
	}
	b.WriteString(hostnameAddr + "\t" + name + "\n")
	return h.writeIdentity("hosts", []byte(b.String()), 0o644)
}

// SetMachineID writes /etc/machine-id.
func (h SystemHooks) SetMachineID(id string) error {
	return h.writeIdentity("machine-id", []byte(id+"\n"), 0o444)
}

// writeIdentity writes an identity file. When /etc/NAME is a symlink into
// the tmpfs RunDir (set up at boot by LinkIdentityFiles), the write goes
// there: a tmpfs write costs microseconds, while creating a file on the
// root filesystem right after a restore costs ~100 ms under TCG (fresh
// translation of the ext4 and journal paths), and this runs before every
// sandbox is ready.
func (h SystemHooks) writeIdentity(name string, data []byte, mode os.FileMode) error {
	target := filepath.Join(h.etc(), name)
	if dest, err := os.Readlink(target); err == nil && dest == filepath.Join(h.run(), name) {
		return writeFileAtomic(dest, data, mode)
	}
	return writeFileAtomic(target, data, mode)
}

func (h SystemHooks) run() string {
	if h.RunDir == "" {
		return "/run/panda"
	}
	return h.RunDir
}

// LinkIdentityFiles makes /etc/hostname, /etc/machine-id and /etc/hosts
// symlinks into the tmpfs RunDir (keeping their content), so that the
// restore hooks write to memory. It runs once at boot; the links are then
// part of every snapshot's disk.
func (h SystemHooks) LinkIdentityFiles() error {
	if err := os.MkdirAll(h.run(), 0o755); err != nil {
		return fmt.Errorf("link identity files: %w", err)
	}
	for _, name := range []string{"hostname", "machine-id", "hosts"} {
		target := filepath.Join(h.etc(), name)
		dest := filepath.Join(h.run(), name)
		if d, err := os.Readlink(target); err == nil && d == dest {
			if _, err := os.Stat(dest); err == nil {
				continue
			}
		}
		old, _ := os.ReadFile(target)
		if err := os.WriteFile(dest, old, 0o644); err != nil {
			return fmt.Errorf("link identity files: %w", err)
		}
		tmp := target + ".panda-link"
		os.Remove(tmp)
		if err := os.Symlink(dest, tmp); err != nil {
			return fmt.Errorf("link identity files: %w", err)
		}
		if err := os.Rename(tmp, target); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("link identity files: %w", err)
		}
	}
	return nil
}

func (h SystemHooks) etc() string {
	if h.EtcDir == "" {
		return "/etc"
	}
	return h.EtcDir
}

// writeFileAtomic replaces path with data via a temporary file and rename.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".panda-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
