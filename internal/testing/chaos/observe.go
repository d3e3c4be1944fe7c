package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// Observe looks at a deployment: its catalog through clients (one per API
// key, each listing its own sandboxes in every state and its snapshots)
// and its data directory (see ObserveHost). The two looks are not atomic:
// a check that fails on an observation taken while something changed is
// retried (see settle).
func Observe(ctx context.Context, dataDir, netPrefix string, clients []*pandastack.Client) (Observation, error) {
	obs := ObserveHost(dataDir, netPrefix)
	obs.Sandboxes = map[string]SandboxRecord{}
	obs.Snapshots = map[string]SnapshotRecord{}
	for k, c := range clients {
		for _, st := range []pandastack.SandboxState{"", pandastack.StateStopped} {
			list, err := c.List(ctx, pandastack.ListOptions{State: st})
			if err != nil {
				return obs, fmt.Errorf("list sandboxes of key %d: %w", k, err)
			}
			for _, sb := range list {
				i := sb.Info
				obs.Sandboxes[i.ID] = SandboxRecord{ID: i.ID, Key: k, State: string(i.State), StopReason: i.StopReason,
					LastError: i.LastError, ParentID: i.ParentID, SnapshotID: i.SnapshotID, Metadata: i.Metadata}
			}
		}
		snaps, err := c.Snapshots(ctx)
		if err != nil {
			return obs, fmt.Errorf("list snapshots of key %d: %w", k, err)
		}
		for _, sn := range snaps {
			obs.Snapshots[sn.ID] = SnapshotRecord{ID: sn.ID, Key: k, SandboxID: sn.SandboxID}
		}
	}
	return obs, nil
}

// ObserveHost looks at a data directory: the QEMU processes serving it,
// its sandbox, run, snapshot and fork directories, lost+found, and the
// mounts under it; with netPrefix, the network namespaces of that prefix
// and the one each sandbox's record names. The catalog fields are left
// empty.
func ObserveHost(dataDir, netPrefix string) Observation {
	store := filepath.Join(dataDir, "store")
	obs := Observation{
		DataDir:      dataDir,
		QEMU:         QEMUProcesses(dataDir),
		SandboxDirs:  map[string]bool{},
		RunDirs:      names(filepath.Join(dataDir, "run")),
		SnapshotDirs: names(filepath.Join(store, "snapshots")),
		ForkDirs:     names(filepath.Join(store, "forks")),
		LostFound:    names(filepath.Join(store, "lost+found")),
		Mounts:       MountsUnder(dataDir),
	}
	for _, id := range names(filepath.Join(store, "sandboxes")) {
		_, err := os.Stat(filepath.Join(store, "sandboxes", id, "paused", "manifest.json"))
		obs.SandboxDirs[id] = err == nil
	}
	if netPrefix != "" {
		obs.NetPrefix = netPrefix
		obs.Namespaces = Namespaces(netPrefix)
		obs.NetNS = map[string]string{}
		for id := range obs.SandboxDirs {
			var rec struct {
				NetNS string `json:"netns"`
			}
			if b, err := os.ReadFile(filepath.Join(store, "sandboxes", id, "sandbox.json")); err == nil && json.Unmarshal(b, &rec) == nil {
				obs.NetNS[id] = rec.NetNS
			}
		}
	}
	return obs
}

// Namespaces lists the network namespaces in /run/netns named
// "<prefix>-...", sorted.
func Namespaces(prefix string) []string {
	var out []string
	for _, n := range names("/run/netns") {
		if strings.HasPrefix(n, prefix+"-") {
			out = append(out, n)
		}
	}
	return out
}

// names lists the entries of dir, sorted; none if it does not exist.
func names(dir string) []string {
	ents, _ := os.ReadDir(dir)
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// QEMUProcesses maps each live QEMU process whose command line names a
// path under dataDir to the id of the sandbox whose run directory
// (dataDir/run/ID) it uses, or "" if it uses none.
func QEMUProcesses(dataDir string) map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	runPrefix := filepath.Join(dataDir, "run") + "/"
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		argv, ok := qemuArgv(pid, dataDir)
		if !ok {
			continue
		}
		id := ""
		for _, a := range argv {
			// The run directory appears in QEMU's -name
			// (guest=panda:DIR,debug-threads=on) or, for a VMM that
			// is not confined, in its socket paths.
			if _, rest, ok := strings.Cut(a, runPrefix); ok {
				if d := rest[:strings.IndexAny(rest+"/", "/,")]; d != "" {
					id = d
					break
				}
			}
		}
		out[pid] = id
	}
	return out
}

// qemuArgv returns the command line of pid if it is a live QEMU process
// that names a path under dataDir.
func qemuArgv(pid int, dataDir string) ([]string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 { // gone, or a zombie
		return nil, false
	}
	if !bytes.Contains(b, []byte(dataDir+"/")) {
		return nil, false
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if !strings.Contains(filepath.Base(argv[0]), "qemu-system") {
		return nil, false
	}
	return argv, true
}

// MountsUnder lists the mount points under dir (this process's mount
// namespace), sorted.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	unescape := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			if mp := unescape.Replace(fields[4]); strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	sort.Strings(out)
	return out
}
