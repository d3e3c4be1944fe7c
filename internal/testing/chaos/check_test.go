package chaos

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// The invariant checker on situations built by hand: real processes and
// files where they are cheap (a fake QEMU, directories of a data
// directory), plain data for the catalog.

// fakeQEMU starts a process whose command line looks like a QEMU's that
// names a path under a data directory: a sleep whose argv[0] is argv0 (a
// path ending in qemu-system-x86_64), killed when the test ends. It
// returns its pid.
func fakeQEMU(t *testing.T, argv0 string) int {
	t.Helper()
	cmd := &exec.Cmd{Path: "/bin/sleep", Args: []string{argv0, "600"}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Until it has exec'd, its command line is the test binary's.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if strings.HasPrefix(string(b), argv0+"\x00") {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("fake QEMU %d: command line %q", pid, b)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// qemuOf is the argv[0] of a fake QEMU of sandbox id in dir.
func qemuOf(dir, id string) string {
	return filepath.Join(dir, "run", id, "qemu-system-x86_64")
}

// dataDir makes a data directory holding a running sandbox run1 (its
// directories and a fake QEMU) and a paused sandbox paused1 (a complete
// capture), and the observation and expectation that go with it.
func dataDir(t *testing.T) (string, Observation, Expectation) {
	t.Helper()
	dir := t.TempDir()
	mkdir := func(p ...string) {
		if err := os.MkdirAll(filepath.Join(append([]string{dir}, p...)...), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	mkdir("store", "sandboxes", "run1")
	mkdir("store", "sandboxes", "paused1", "paused")
	if err := os.WriteFile(filepath.Join(dir, "store", "sandboxes", "paused1", "paused", "manifest.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	mkdir("run", "run1")
	mkdir("store", "snapshots", "snap1")
	mkdir("store", "forks")
	fakeQEMU(t, qemuOf(dir, "run1"))
	obs := ObserveHost(dir, "")
	obs.Sandboxes = map[string]SandboxRecord{
		"run1":    {ID: "run1", State: stateRunning},
		"paused1": {ID: "paused1", State: statePaused, Key: 1},
		"old1":    {ID: "old1", State: stateStopped, StopReason: "killed"},
	}
	obs.Snapshots = map[string]SnapshotRecord{"snap1": {ID: "snap1", SandboxID: "run1"}}
	exp := Expectation{
		Sandboxes: map[string]Outcomes{"run1": NewOutcomes(stateRunning), "paused1": NewOutcomes(statePaused)},
		Gone:      map[string]string{"old1": "killed"},
		Snapshots: map[string]bool{"snap1": true},
	}
	return dir, obs, exp
}

func TestCheckPassesAConsistentDeployment(t *testing.T) {
	_, obs, exp := dataDir(t)
	if ids := slices.Collect(maps.Values(obs.QEMU)); len(ids) != 1 || ids[0] != "run1" {
		t.Fatalf("QEMU processes observed: %v, want one of run1", obs.QEMU)
	}
	if got := Check(exp, obs); len(got) != 0 {
		t.Errorf("Check of a consistent deployment: %q, want none", got)
	}
}

func TestCheckFindsViolations(t *testing.T) {
	for _, tc := range []struct {
		name string
		// change makes the situation wrong; want is a part of the
		// violation Check must report.
		change func(t *testing.T, dir string, obs *Observation, exp *Expectation)
		want   string
	}{
		{"orphan QEMU", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			fakeQEMU(t, qemuOf(dir, "gone1"))
			obs.QEMU = QEMUProcesses(dir)
		}, "serves sandbox gone1, which the catalog does not list"},
		{"QEMU of no sandbox", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			fakeQEMU(t, filepath.Join(dir, "store", "qemu-system-x86_64"))
			obs.QEMU = QEMUProcesses(dir)
		}, "serves no sandbox"},
		{"QEMU of a paused sandbox", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			fakeQEMU(t, qemuOf(dir, "paused1"))
			obs.QEMU = QEMUProcesses(dir)
		}, "serves sandbox paused1, which is paused"},
		{"two QEMUs of a sandbox", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			fakeQEMU(t, qemuOf(dir, "run1"))
			obs.QEMU = QEMUProcesses(dir)
		}, "sandbox run1 has 2 QEMU processes"},
		{"running sandbox without QEMU", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.QEMU = map[int]string{}
		}, "running sandbox run1 has no QEMU process"},
		{"lost paused sandbox", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			delete(obs.Sandboxes, "paused1")
		}, "sandbox paused1 is lost"},
		{"paused sandbox stopped", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.Sandboxes["paused1"] = SandboxRecord{ID: "paused1", State: stateStopped, StopReason: "vmm_exited"}
		}, "sandbox paused1 is stopped (vmm_exited)"},
		{"paused sandbox without its capture", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.Remove(filepath.Join(dir, "store", "sandboxes", "paused1", "paused", "manifest.json"))
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "paused sandbox paused1 has no complete pause capture"},
		{"wrong stop reason", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			exp.Sandboxes["run1"] = NewOutcomes(stateRunning, "stopped:expired")
			obs.Sandboxes["run1"] = SandboxRecord{ID: "run1", State: stateStopped, StopReason: "killed"}
		}, "want running or stopped:expired"},
		{"transitional state", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.Sandboxes["paused1"] = SandboxRecord{ID: "paused1", State: "resuming"}
		}, "sandbox paused1 is still resuming"},
		{"stopped sandbox back", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.Sandboxes["old1"] = SandboxRecord{ID: "old1", State: stateRunning}
		}, "sandbox old1 was stopped (killed) and is now running"},
		{"stranger", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.Sandboxes["new1"] = SandboxRecord{ID: "new1", State: stateStopped, StopReason: "host_restarted", Metadata: map[string]string{labelOp: "7"}}
		}, "sandbox new1 is stopped (host_restarted) but the suite never made it"},
		{"sandbox directory of nobody", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.MkdirAll(filepath.Join(dir, "store", "sandboxes", "old1"), 0o700)
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "store/sandboxes/old1 belongs to no live sandbox"},
		{"run directory of a paused sandbox", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.MkdirAll(filepath.Join(dir, "run", "paused1"), 0o700)
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "run/paused1 belongs to sandbox paused1, which is paused"},
		{"lost snapshot", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.RemoveAll(filepath.Join(dir, "store", "snapshots", "snap1"))
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "snapshot snap1 (of sandbox run1) is listed but its files are gone"},
		{"unrecorded snapshot", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			delete(obs.Snapshots, "snap1")
			delete(exp.Snapshots, "snap1")
		}, "store/snapshots/snap1 belongs to no snapshot in the catalog"},
		{"interrupted snapshot left", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.MkdirAll(filepath.Join(dir, "store", "snapshots", "snap2.tmp"), 0o700)
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "store/snapshots/snap2.tmp is left"},
		{"fork capture left", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.MkdirAll(filepath.Join(dir, "store", "forks", "run1-123"), 0o700)
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "store/forks/run1-123 is left"},
		{"lost+found", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			os.MkdirAll(filepath.Join(dir, "store", "lost+found", "paused1-1"), 0o700)
			*obs = withCatalog(ObserveHost(dir, ""), *obs)
		}, "recovery gave up"},
		{"stray mount", func(t *testing.T, dir string, obs *Observation, exp *Expectation) {
			obs.Mounts = append(obs.Mounts, filepath.Join(dir, "store", "sandboxes", "run1", "mnt"))
		}, "run1/mnt is mounted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, obs, exp := dataDir(t)
			tc.change(t, dir, &obs, &exp)
			got := Check(exp, obs)
			if !slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, tc.want) }) {
				t.Errorf("Check = %q, want a violation containing %q", got, tc.want)
			}
		})
	}
}

// withCatalog is a host observation with the catalog of another.
func withCatalog(host, cat Observation) Observation {
	host.Sandboxes, host.Snapshots = cat.Sandboxes, cat.Snapshots
	return host
}

// What interrupted operations may have made is adopted, not a stranger:
// a fork child of a parent whose fork failed, a create whose answer was
// lost, a snapshot whose answer was lost.
func TestCheckAdoptsWhatInterruptedOperationsMade(t *testing.T) {
	_, obs, exp := dataDir(t)
	obs.Sandboxes["child1"] = SandboxRecord{ID: "child1", State: stateStopped, StopReason: "host_restarted", ParentID: "run1"}
	obs.Sandboxes["new1"] = SandboxRecord{ID: "new1", State: stateStopped, StopReason: "host_restarted", Metadata: map[string]string{labelOp: "7"}}
	exp.PendingForks = map[string]bool{"run1": true}
	exp.PendingCreates = map[string]bool{"7": true}
	if got := Check(exp, obs); len(got) != 0 {
		t.Errorf("Check with interrupted operations' sandboxes: %q, want none", got)
	}
	obs.Sandboxes["child1"] = SandboxRecord{ID: "child1", State: "starting", ParentID: "run1"}
	if got := Check(exp, obs); len(got) != 1 || !strings.Contains(got[0], "still starting") {
		t.Errorf("Check with a child still starting: %q, want it reported", got)
	}
}

// The probe of a sandbox's files and processes: a lost file, a lost
// process, a file with other contents are violations; what was uncertain
// is resolved by what is found.
func TestCheckProbe(t *testing.T) {
	const sumA, sumB = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	want := func() contents {
		return contents{
			files: map[string]fileWant{
				filePrefix + "1": {sums: map[string]bool{sumA: true}},
				filePrefix + "2": {sums: map[string]bool{sumA: true, sumB: true}, maybeAbsent: true}, // its write was interrupted
			},
			markers: map[string]bool{"1000000001": true, "1000000002": false},
		}
	}
	for _, tc := range []struct {
		name, out  string
		violations []string
		after      func(c contents) bool // what the probe resolved
	}{
		{"all there", "sleep 1000000001\nsleep 1000000002\n" + sumA + "  " + filePrefix + "1\n" + sumB + "  " + filePrefix + "2\n", nil,
			func(c contents) bool {
				return c.markers["1000000002"] && !c.files[filePrefix+"2"].maybeAbsent && len(c.files[filePrefix+"2"].sums) == 1
			}},
		{"uncertain ones absent", "sleep 1000000001\n" + sumA + "  " + filePrefix + "1\n", nil,
			func(c contents) bool {
				must, m := c.markers["1000000002"]
				_, f := c.files[filePrefix+"2"]
				return m && !must && !f // the marker may still start; the file was never written
			}},
		{"lost file", "sleep 1000000001\n", []string{"sandbox x lost its file " + filePrefix + "1"}, nil},
		{"lost process", sumA + "  " + filePrefix + "1\n", []string{"sandbox x lost its process `sleep 1000000001`"}, nil},
		{"other contents", "sleep 1000000001\n" + sumB + "  " + filePrefix + "1\n", []string{"sandbox x: " + filePrefix + "1 has SHA-256 bbbbbbbbbbbb…, want aaaaaaaaaaaa…"}, nil},
		{"strangers", "sleep 1000000001\nsleep 1000000009\n" + sumA + "  " + filePrefix + "1\n" + sumA + "  " + filePrefix + "9\n",
			[]string{"sandbox x has a file " + filePrefix + "9 it never wrote", "sandbox x runs `sleep 1000000009`, which it never started"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := want()
			got := c.checkProbe("x", tc.out)
			if !slices.Equal(got, tc.violations) {
				t.Errorf("checkProbe = %q, want %q", got, tc.violations)
			}
			if tc.after != nil && !tc.after(c) {
				t.Errorf("after the probe: %+v", c)
			}
		})
	}
}

// merge: what one of several possible states of a sandbox may hold.
func TestMerge(t *testing.T) {
	a := contents{files: map[string]fileWant{"f1": {sums: map[string]bool{"s1": true}}}, markers: map[string]bool{"m1": true, "m2": true}}
	b := contents{files: map[string]fileWant{"f1": {sums: map[string]bool{"s2": true}}, "f2": {sums: map[string]bool{"s3": true}}},
		markers: map[string]bool{"m1": true}, shortTTL: true}
	got := merge([]contents{a, b})
	if f := got.files["f1"]; !f.sums["s1"] || !f.sums["s2"] || f.maybeAbsent {
		t.Errorf("f1 (in both): %+v, want s1 or s2, present", f)
	}
	if f := got.files["f2"]; !f.sums["s3"] || !f.maybeAbsent {
		t.Errorf("f2 (in one): %+v, want s3 or absent", f)
	}
	if !got.markers["m1"] || got.markers["m2"] {
		t.Errorf("markers %v, want m1 required, m2 optional", got.markers)
	}
	if !got.shortTTL {
		t.Error("merge lost a short TTL")
	}
}

func TestFlat(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		slack  float64
		want   bool
	}{
		{"flat", []float64{50, 100, 101, 99, 102, 100, 101, 100, 99, 103, 100, 101}, 0, true},
		{"noisy within slack", []float64{50, 100, 110, 95, 120, 100, 118, 105, 119, 121, 115, 118}, 5, true},
		{"warm-up ignored", []float64{10, 100, 100, 100, 100, 100, 100}, 0, true},
		{"leak", []float64{100, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200}, 0, false},
		{"leak beyond slack", []float64{100, 100, 100, 100, 100, 100, 100, 100, 100, 150, 150, 150}, 16, false},
		{"too few to judge", []float64{100, 300, 900}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, why := Flat(tc.values, tc.slack); got != tc.want {
				t.Errorf("Flat(%v, %v) = %v (%s), want %v", tc.values, tc.slack, got, why, tc.want)
			}
		})
	}
}

// QEMUProcesses sees the processes testkit.QEMUProcs sees (the clean-up
// that ends a run) and no other.
func TestQEMUProcessesAgreesWithPandatest(t *testing.T) {
	dir, obs, _ := dataDir(t)
	fakeQEMU(t, filepath.Join(dir, "store", "qemu-system-x86_64"))
	got := slices.Sorted(maps.Keys(QEMUProcesses(dir)))
	want := testkit.QEMUProcs(dir)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(got) != len(obs.QEMU)+1 {
		t.Errorf("QEMUProcesses %v, testkit.QEMUProcs %v; want the same two", got, want)
	}
}

// With networking, every running sandbox has a namespace of its own that
// exists, and every namespace of the prefix is a running sandbox's.
func TestCheckNetwork(t *testing.T) {
	for _, tc := range []struct {
		name       string
		namespaces []string
		netns      map[string]string
		want       string // "" for no violation
	}{
		{"ok", []string{"c1-aaaaaaaa"}, map[string]string{"run1": "c1-aaaaaaaa", "paused1": "c1-bbbbbbbb"}, ""},
		{"none recorded", []string{"c1-aaaaaaaa"}, map[string]string{}, "running sandbox run1 names no network namespace"},
		{"lost", nil, map[string]string{"run1": "c1-aaaaaaaa"}, "running sandbox run1 has lost its network namespace c1-aaaaaaaa"},
		{"leftover", []string{"c1-aaaaaaaa", "c1-bbbbbbbb"}, map[string]string{"run1": "c1-aaaaaaaa", "paused1": "c1-bbbbbbbb"},
			"network namespace c1-bbbbbbbb belongs to no running sandbox"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, obs, exp := dataDir(t)
			obs.NetPrefix, obs.Namespaces, obs.NetNS = "c1", tc.namespaces, tc.netns
			got := Check(exp, obs)
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("Check = %q, want no violation", got)
			case tc.want != "" && !slices.Contains(got, tc.want):
				t.Errorf("Check = %q, want %q", got, tc.want)
			}
		})
	}
}
