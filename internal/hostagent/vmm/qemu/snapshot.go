package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

// Pause implements vmm.Machine.
func (m *Machine) Pause(ctx context.Context) error {
	if err := m.exec(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return nil
}

// Resume implements vmm.Machine.
func (m *Machine) Resume(ctx context.Context) error {
	if err := m.exec(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}

// SaveState implements vmm.Machine. The machine must be paused. The
// driver creates path (mode 0600) and passes it to QEMU as a file
// descriptor (QMP add-fd, written as /dev/fdset/N): a confined QEMU cannot
// see the host's paths.
func (m *Machine) SaveState(ctx context.Context, path string) error {
	var st struct {
		Running bool   `json:"running"`
		Status  string `json:"status"`
	}
	if err := m.exec(ctx, "query-status", nil, &st); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if st.Running {
		return fmt.Errorf("save state: machine is %s, want paused", st.Status)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer f.Close()
	var fdset struct {
		ID int `json:"fdset-id"`
	}
	if err := m.execWithFDs(ctx, "add-fd", map[string]any{"opaque": "save-state"}, &fdset, []int{int(f.Fd())}); err != nil {
		return fmt.Errorf("save state: pass fd: %w", err)
	}
	// live=false keeps the block devices active in this process (live=true
	// would hand them over to a migration target and leave us without disks).
	err = m.exec(ctx, "xen-save-devices-state", map[string]any{"filename": fmt.Sprintf("/dev/fdset/%d", fdset.ID), "live": false}, nil)
	// QEMU closed its duplicate; drop the set's own copy.
	if rerr := m.exec(ctx, "remove-fd", map[string]any{"fdset-id": fdset.ID}, nil); rerr != nil && err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// LoadState implements vmm.Machine. A state whose device layout differs
// from the machine's makes QEMU exit ("qmp connection closed"); the one
// difference the vmm contract allows a caller to get wrong, a network
// interface on one side only, is caught before loading.
func (m *Machine) LoadState(ctx context.Context, statePath string) error {
	f, err := os.Open(statePath)
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	defer f.Close()
	saved, err := io.ReadAll(io.NewSectionReader(f, 0, maxStateSize))
	if err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	switch has := savedNIC(saved); {
	case has && m.spec.Net == nil:
		return errors.New("load state: the saved machine has a network interface and this one has none (vmm.Spec.Net)")
	case !has && m.spec.Net != nil:
		return errors.New("load state: the saved machine has no network interface and this one has one (vmm.Spec.Net)")
	}
	if err := m.execWithFDs(ctx, "getfd", map[string]string{"fdname": "state"}, nil, []int{int(f.Fd())}); err != nil {
		return fmt.Errorf("load state: pass fd: %w", err)
	}
	if err := m.exec(ctx, "migrate-incoming", map[string]string{"uri": "fd:state"}, nil); err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	// The state is a few KiB: poll rather than wait for events.
	for delay := 200 * time.Microsecond; ; {
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := m.exec(ctx, "query-migrate", nil, &st); err != nil {
			return fmt.Errorf("load state: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("load state %s: migration %s: %s", statePath, st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("load state: %w", ctx.Err())
		case <-time.After(delay):
		}
		if delay < 5*time.Millisecond {
			delay *= 2
		}
	}
}

// maxStateSize bounds what LoadState reads of a device state to look for a
// network interface: states are a few tens of KiB.
const maxStateSize = 4 << 20

// savedNIC reports whether a device state saved by SaveState holds a
// virtio-net device: a section named "virtio-mmio@ADDRESS/virtio-net",
// which the stream writes after the length of the name. (A guest can put
// bytes of its choosing into some device state, e.g. CMOS RAM; at worst it
// makes its own captures unloadable.)
func savedNIC(state []byte) bool {
	prefix := []byte("virtio-mmio@")
	for off := 0; ; {
		i := bytes.Index(state[off:], prefix)
		if i < 0 {
			return false
		}
		i += off
		if i > 0 {
			if n := int(state[i-1]); i+n <= len(state) && bytes.HasSuffix(state[i:i+n], []byte("/virtio-net")) {
				return true
			}
		}
		off = i + len(prefix)
	}
}

// RAMMapping implements vmm.Machine by finding the mapping of the memory
// file in /proc/PID/maps by device and inode (a confined QEMU maps it from
// a path of its own jail), offset 0 and the guest's RAM size.
func (m *Machine) RAMMapping() (vmm.RAMMapping, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", m.pid))
	if err != nil {
		return vmm.RAMMapping{}, fmt.Errorf("read maps: %w", err)
	}
	want := uint64(m.spec.MemoryMiB) << 20
	for _, line := range strings.Split(string(b), "\n") {
		// start-end perms offset dev inode path
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != strconv.FormatUint(m.memID.ino, 10) {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseUint(f[2], 16, 64)
		if err1 != nil || err2 != nil || err3 != nil || off != 0 || end-start != want {
			continue
		}
		// maps shows the device of the file's superblock, which is not
		// always st_dev (btrfs subvolumes): stat the mapping itself.
		id, err := statID(fmt.Sprintf("/proc/%d/map_files/%s", m.pid, f[0]))
		if err != nil || id != m.memID {
			continue
		}
		return vmm.RAMMapping{PID: m.pid, Start: start, Size: want}, nil
	}
	return vmm.RAMMapping{}, fmt.Errorf("no %d MiB mapping of %s in process %d", m.spec.MemoryMiB, m.spec.MemoryFile, m.pid)
}
