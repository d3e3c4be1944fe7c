package devcluster_test

// Tests of the fleet on a dev cluster: real PostgreSQL, versitygw, three
// `panda agent` processes each in its own network namespace, `panda
// server --fleet`, QEMU guests under TCG from the tiny template at 256
// MiB. One cluster serves the whole test, in order; whatever happens it is
// closed in t.Cleanup, and a passing test must find nothing left.
//
// Environment: PANDA_BIN (default: go build ./cmd/panda), PANDA_TEST_IMAGES
// (default /var/lib/pandastack/images), PANDA_VERSITYGW (default: where
// make s3-deps puts it). Needs root. Skipped with -short.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	hostpkg "github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/pandastack/pandastack/internal/testing/devcluster"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

func TestMain(m *testing.M) { os.Exit(pandatest.Main(m)) }

// lostAfter is the control plane's --host-lost-after in the test.
const lostAfter = 3 * time.Second

// name and subnet of the test's cluster: fixed, so that a run that was
// killed is cleaned up by the next (a second run at once fails on the
// name's lock instead).
const name = "pdt"

var subnet = netip.MustParsePrefix("10.238.0.0/24")

// syncBuffer collects the cluster's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startCluster starts the test's cluster, closed (and checked for
// leftovers) when the test ends.
func startCluster(t *testing.T) *devcluster.Cluster {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t) // namespaces, XFS stores
	bin, gw, addr := binaries(t)
	out := &syncBuffer{}
	began := time.Now()
	c, err := devcluster.Start(context.Background(), devcluster.Config{
		Agents: 3, Listen: addr, Images: testkit.Images(), Binary: bin, Versitygw: gw,
		Name: name, Subnet: subnet, Env: os.Environ(), Out: out, ReadyTimeout: 3 * time.Minute,
		AgentArgs: []string{"--accel", "tcg", "--default-template", "tiny", "--default-memory", "256"},
		// agent-2 builds the user templates: killed below, it shows
		// that they outlive their building host.
		ServerArgs: []string{"--host-lost-after", lostAfter.String(), "--template-host", "agent-2"},
	})
	if err != nil {
		t.Fatalf("start the dev cluster: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("dev cluster ready in %v", time.Since(began).Round(10*time.Millisecond))
	var pids []int
	for _, a := range c.Agents() {
		pids = append(pids, a.PID())
	}
	pids = append(pids, c.ServerPID())
	dataDir := c.DataDir()
	t.Cleanup(func() {
		began := time.Now()
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		t.Logf("dev cluster closed in %v", time.Since(began).Round(10*time.Millisecond))
		if t.Failed() {
			t.Logf("dev cluster output:\n%s", out.String())
		}
		checkNothingLeft(t, dataDir, pids)
	})
	return c
}

// checkNothingLeft fails if anything of the cluster outlived Close.
func checkNothingLeft(t *testing.T, dataDir string, pids []int) {
	t.Helper()
	for _, pid := range pids {
		if testkit.Alive(pid) {
			t.Errorf("process %d still runs after Close", pid)
		}
	}
	if pids := qemuUnder(dataDir); len(pids) > 0 {
		t.Errorf("QEMU processes %v still run after Close", pids)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary data directory %s after Close: %v, want it removed", dataDir, err)
	}
	ns, _ := os.ReadDir("/run/netns")
	for _, e := range ns {
		if strings.HasPrefix(e.Name(), name+"-") {
			t.Errorf("namespace %s left after Close", e.Name())
		}
	}
	links, _ := exec.Command("ip", "-br", "link").Output()
	for _, l := range strings.Split(string(links), "\n") {
		if strings.HasPrefix(l, name+"-") {
			t.Errorf("interface left after Close: %s", l)
		}
	}
	for _, f := range []string{"/run/pandastack/dev-cluster-" + name + ".json", "/run/pandastack/dev-cluster-" + name + ".lock"} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Close: %v, want it removed", f, err)
		}
	}
	if left := testkit.MountsUnder(dataDir); len(left) != 0 {
		t.Errorf("mounts under %s left after Close: %q", dataDir, left)
	}
}

func qemuUnder(dir string) []int { return testkit.QEMUProcs(dir) }

// api is the REST API as the admin, in raw requests: the tests check the
// HTTP statuses themselves.
type api struct {
	t   *testing.T
	url string
	key string
	sdk *pandastack.Client
}

func newAPI(t *testing.T, c *devcluster.Cluster) *api {
	key, err := c.AdminKey()
	if err != nil {
		t.Fatal(err)
	}
	sdk, err := pandastack.NewClient(pandastack.Options{APIURL: c.URL(), APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	return &api{t: t, url: c.URL(), key: key, sdk: sdk}
}

// do sends a request with a JSON body (nil for none) and decodes the
// answer into out (if not nil); it returns the status and the body.
func (a *api) do(method, path, auth string, body, out any) (int, string) {
	a.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, r)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(b, out); err != nil {
			a.t.Fatalf("%s %s: %v in %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

type sandbox struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	HostID     string `json:"host_id"`
	Stored     string `json:"stored"`      // a paused sandbox's: local, uploading or durable
	NetworkOff bool   `json:"network_off"` // the dev cluster's agents run --network off
}

type host struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Draining  bool   `json:"draining"`
	MemoryMiB int    `json:"memory_mib"`
	FreeMiB   int    `json:"memory_available_mib"`
	CPUs      int    `json:"vcpus"`
	// NetworkOff: the dev cluster's agents run --network off.
	NetworkOff bool `json:"network_off"`
}

// create creates a sandbox (placement nil: the scheduler's choice) and
// returns it, failing the test unless it is running.
func (a *api) create(placement any) sandbox {
	a.t.Helper()
	body := map[string]any{"ttl_seconds": 600}
	if placement != nil {
		body["placement"] = placement
	}
	var sb sandbox
	if st, b := a.do(http.MethodPost, "/v1/sandboxes", a.key, body, &sb); st != http.StatusCreated && st != http.StatusOK {
		a.t.Fatalf("create with placement %v: %d %s", placement, st, b)
	}
	if sb.State != "running" {
		a.t.Fatalf("create: state %s, want running", sb.State)
	}
	return sb
}

// fork forks parent into count children (placement nil: the default).
func (a *api) fork(parent string, count int, placement any) (int, string, []sandbox) {
	a.t.Helper()
	body := map[string]any{"count": count}
	if placement != nil {
		body["placement"] = placement
	}
	var out struct {
		Children []struct {
			Sandbox *sandbox `json:"sandbox"`
		} `json:"children"`
	}
	st, b := a.do(http.MethodPost, "/v1/sandboxes/"+parent+"/fork", a.key, body, &out)
	kids := make([]sandbox, len(out.Children))
	for i, k := range out.Children {
		if k.Sandbox != nil { // else its error is in the body
			kids[i] = *k.Sandbox
		}
	}
	return st, b, kids
}

func (a *api) get(id string) sandbox {
	a.t.Helper()
	var sb sandbox
	if st, b := a.do(http.MethodGet, "/v1/sandboxes/"+id, a.key, nil, &sb); st != http.StatusOK {
		a.t.Fatalf("get %s: %d %s", id, st, b)
	}
	return sb
}

// list lists the sandboxes (running, paused and the rest).
func (a *api) list() []sandbox {
	a.t.Helper()
	var out struct {
		Sandboxes []sandbox `json:"sandboxes"`
	}
	if st, b := a.do(http.MethodGet, "/v1/sandboxes", a.key, nil, &out); st != http.StatusOK {
		a.t.Fatalf("list: %d %s", st, b)
	}
	return out.Sandboxes
}

func (a *api) hosts() []host {
	a.t.Helper()
	var out struct {
		Hosts []host `json:"hosts"`
	}
	if st, b := a.do(http.MethodGet, "/v1/hosts", a.key, nil, &out); st != http.StatusOK {
		a.t.Fatalf("hosts: %d %s", st, b)
	}
	return out.Hosts
}

// exec runs cmd in sandbox id and returns its stdout.
func (a *api) exec(id, cmd string) string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := a.sdk.Sandbox(id).Exec(ctx, pandastack.Command{Cmd: cmd})
	if err != nil || r.ExitCode != 0 {
		a.t.Fatalf("exec %q in %s: %+v, %v", cmd, id, r, err)
	}
	return r.Stdout
}

func hostState(hs []host, id string) string {
	for _, h := range hs {
		if h.ID == id {
			return h.State
		}
	}
	return ""
}

// TestDevCluster: a fleet of three hosts on one machine. Placement on a
// named host, forks on the parent's host by default, spread over hosts,
// drain and activate, a host killed with its VMMs (its sandbox lost, and
// killable), the control plane restarted (hosts and sandboxes adopted),
// and the errors of bad requests.
func TestDevCluster(t *testing.T) {
	c := startCluster(t)
	a := newAPI(t, c)
	var ids []string
	for _, ag := range c.Agents() {
		ids = append(ids, ag.ID)
	}

	t.Run("hosts", func(t *testing.T) {
		a.t = t
		hs := a.hosts()
		var got []string
		for _, h := range hs {
			got = append(got, h.ID+"="+h.State)
		}
		slices.Sort(got)
		want := []string{"agent-1=ready", "agent-2=ready", "agent-3=ready"}
		if !slices.Equal(got, want) {
			t.Fatalf("hosts: got %v, want %v", got, want)
		}
		// The agents share the machine's memory out: each offers a third,
		// and the scheduler's reserve it keeps free.
		offered := c.AgentMemoryMiB()
		if total := hostpkg.LocalResources().MemoryMiB; offered != total/3+scheduler.ReserveMiB {
			t.Errorf("each agent offers %d MiB, want a third of the machine's %d and %d MiB", offered, total, scheduler.ReserveMiB)
		}
		// And its CPUs, at least one each.
		cpus := c.AgentCPUs()
		if total := hostpkg.LocalResources().VCPUs; cpus != max(1, total/3) {
			t.Errorf("each agent offers %d CPUs, want a third of the machine's %d, at least one", cpus, total)
		}
		for _, h := range hs {
			if h.MemoryMiB != offered || h.FreeMiB <= 0 || h.FreeMiB > offered {
				t.Errorf("host %s: memory %d MiB, %d free; want %d, and free within it", h.ID, h.MemoryMiB, h.FreeMiB, offered)
			}
			if h.CPUs != cpus {
				t.Errorf("host %s: %d CPUs, want %d", h.ID, h.CPUs, cpus)
			}
			if !h.NetworkOff {
				t.Errorf("host %s: network_off false, want true (its agent runs --network off)", h.ID)
			}
		}
	})

	var onTwo sandbox // on agent-2, killed with its host below
	t.Run("placement on a named host", func(t *testing.T) {
		a.t = t
		for _, id := range []string{"agent-2", "agent-3"} {
			sb := a.create(map[string]any{"host": id})
			if sb.HostID != id || !sb.NetworkOff {
				t.Errorf("create on %s: %+v, want it there, with network_off (a host without sandbox networking)", id, sb)
			}
			if id == "agent-2" {
				onTwo = sb
			}
		}
		// What its machines hold counts against what a host offers, in
		// its next heartbeats.
		testkit.WaitFor(t, 20*time.Second, "agent-2's free memory to count its sandbox", func() bool {
			for _, h := range a.hosts() {
				if h.ID == "agent-2" {
					return h.FreeMiB > 0 && h.FreeMiB < h.MemoryMiB
				}
			}
			return false
		})
	})

	t.Run("templates of every host", func(t *testing.T) {
		a.t = t
		// A shape only agent-2 bakes (every agent baked tiny at 256 MiB)
		// is listed as baked, whichever host the listing asks first.
		body := map[string]any{"ttl_seconds": 600, "template": "tiny", "memory_mib": 512, "placement": map[string]any{"host": "agent-2"}}
		var sb sandbox
		if st, b := a.do(http.MethodPost, "/v1/sandboxes", a.key, body, &sb); st != http.StatusCreated && st != http.StatusOK {
			t.Fatalf("create tiny at 512 MiB on agent-2: %d %s", st, b)
		}
		defer a.do(http.MethodDelete, "/v1/sandboxes/"+sb.ID, a.key, nil, nil)
		var out struct {
			Templates []struct {
				Name      string `json:"name"`
				MemoryMiB int    `json:"memory_mib"`
				State     string `json:"state"`
			} `json:"templates"`
		}
		if st, b := a.do(http.MethodGet, "/v1/templates", a.key, nil, &out); st != http.StatusOK {
			t.Fatalf("list templates: %d %s", st, b)
		}
		var got []string
		for _, tp := range out.Templates {
			got = append(got, fmt.Sprintf("%s/%d/%s", tp.Name, tp.MemoryMiB, tp.State))
		}
		if !slices.Contains(got, "tiny/512/ready") || !slices.Contains(got, "tiny/256/ready") {
			t.Errorf("templates %v, want tiny at 256 and at 512 MiB ready", got)
		}
	})

	// listsFleetapp checks that GET /v1/templates lists fleetapp:1.
	listsFleetapp := func(t *testing.T, when string) {
		t.Helper()
		type listed struct {
			Name    string `json:"name"`
			Version int    `json:"version"`
		}
		var list struct {
			Templates []listed `json:"templates"`
		}
		if st, out := a.do(http.MethodGet, "/v1/templates", a.key, nil, &list); st != http.StatusOK {
			t.Errorf("list templates %s: %d %s", when, st, out)
		}
		if !slices.ContainsFunc(list.Templates, func(tp listed) bool { return tp.Name == "fleetapp" && tp.Version == 1 }) {
			t.Errorf("templates %s: %+v, want fleetapp version 1", when, list.Templates)
		}
	}
	// fleetappCopies matches agent-(i+1)'s copies of user template fleetapp.
	fleetappCopies := func(i int) string {
		return filepath.Join(c.Agents()[i].DataDir, "store", "rootfs", ".v-fleetapp-*")
	}
	t.Run("template built on one host, used on another", func(t *testing.T) {
		a.t = t
		// agent-2 builds (--template-host); agent-3 fetches the version
		// from the object store on its first create. The registry is the
		// catalog's: "host killed" uses and deletes the template while
		// agent-2 is away.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var lines []string
		b, err := a.sdk.BuildTemplateFromDockerfile(ctx, "fleetapp", "FROM tiny\nRUN echo built-on-$(cat /etc/hostname) > /root/built\n", t.TempDir(),
			func(l string) { lines = append(lines, l) })
		if err != nil || b.Version != 1 || b.HostID != "agent-2" {
			t.Fatalf("build on the fleet: %+v, %v; want version 1 built on agent-2\n%s", b, err, strings.Join(lines, "\n"))
		}
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "uploading template fleetapp:1 to the object store") }) {
			t.Errorf("the build's log does not tell of its upload:\n%s", strings.Join(lines, "\n"))
		}
		body := map[string]any{"ttl_seconds": 600, "template": "fleetapp", "placement": map[string]any{"host": "agent-3"}}
		var sb sandbox
		if st, out := a.do(http.MethodPost, "/v1/sandboxes", a.key, body, &sb); st != http.StatusCreated && st != http.StatusOK {
			t.Fatalf("create fleetapp on agent-3: %d %s", st, out)
		}
		if sb.HostID != "agent-3" {
			t.Errorf("fleetapp's sandbox landed on %s, want agent-3", sb.HostID)
		}
		if got := a.exec(sb.ID, "cat /root/built"); !strings.HasPrefix(got, "built-on-") {
			t.Errorf("fleetapp's sandbox on agent-3 reads %q, want the build's file", got)
		}
		a.do(http.MethodDelete, "/v1/sandboxes/"+sb.ID, a.key, nil, nil)
		listsFleetapp(t, "after its build")
		if m, _ := filepath.Glob(fleetappCopies(2)); len(m) != 1 {
			t.Errorf("agent-3 holds %d copies of fleetapp (%s), want 1", len(m), fleetappCopies(2))
		}
	})

	t.Run("fork stays on the parent's host", func(t *testing.T) {
		a.t = t
		if onTwo.ID == "" {
			t.Skip("no parent: placement failed")
		}
		a.exec(onTwo.ID, "echo parent > /root/mark")
		st, b, kids := a.fork(onTwo.ID, 2, nil)
		if st != http.StatusOK || len(kids) != 2 {
			t.Fatalf("fork: %d %s", st, b)
		}
		for _, k := range kids {
			if k.ID == "" {
				t.Fatalf("fork: a child failed: %s", b)
			}
			if k.HostID != onTwo.HostID {
				t.Errorf("child %s on %s, want the parent's host %s", k.ID, k.HostID, onTwo.HostID)
			}
			if got := a.exec(k.ID, "cat /root/mark"); got != "parent\n" {
				t.Errorf("child %s reads %q, want the parent's file", k.ID, got)
			}
		}
	})

	t.Run("spread", func(t *testing.T) {
		a.t = t
		// Children on other hosts restore the parent's capture, sent
		// there straight from the parent's host (through the object
		// store where it cannot be): its files and the memory of a
		// process it runs.
		parent := a.create(nil)
		a.exec(parent.ID, "echo spread > /root/mark; setsid sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /root/pid")
		st, b, kids := a.fork(parent.ID, 3, "spread")
		if st != http.StatusOK {
			t.Fatalf("fork with spread: %d %s", st, b)
		}
		on := map[string]bool{}
		for _, k := range kids {
			if k.ID == "" {
				t.Errorf("fork with spread: a child failed: %s", b)
				continue
			}
			on[k.HostID] = true
			if got := a.exec(k.ID, "cat /root/mark; kill -0 $(cat /root/pid) && echo alive"); got != "spread\nalive\n" {
				t.Errorf("child %s on %s: got %q, want the parent's file and its running process", k.ID, k.HostID, got)
			}
		}
		if len(on) < 2 {
			t.Errorf("fork with spread: children on %v, want at least 2 hosts; answer %s", on, b)
		}
		// What went straight from host to host, the children's hosts
		// fetched from the parent's themselves (a pack ticket, the
		// parent's host's CA): the control plane relayed none of it.
		var moved struct {
			Direct int64 `json:"cross_host_direct_bytes"`
			Pulled int64 `json:"cross_host_pulled_bytes"`
		}
		if err := json.Unmarshal([]byte(b), &moved); err != nil || moved.Pulled != moved.Direct {
			t.Errorf("fork with spread: %+v, %v; want every byte sent directly pulled by the children's hosts", moved, err)
		}
		t.Logf("fork with spread: %+v", moved)
	})

	t.Run("drain and activate", func(t *testing.T) {
		a.t = t
		if st, b := a.do(http.MethodPost, "/v1/hosts/agent-1/drain", a.key, nil, nil); st != http.StatusOK {
			t.Fatalf("drain agent-1: %d %s", st, b)
		}
		if got := hostState(a.hosts(), "agent-1"); got != "draining" {
			t.Errorf("agent-1 drained: state %q, want draining", got)
		}
		for range 3 {
			if sb := a.create(nil); sb.HostID == "agent-1" {
				t.Errorf("create while agent-1 drains: placed on agent-1")
			}
		}
		if st, b := a.do(http.MethodPost, "/v1/sandboxes", a.key, map[string]any{"placement": map[string]any{"host": "agent-1"}}, nil); st != http.StatusConflict {
			t.Errorf("create on draining agent-1: %d %s, want 409", st, b)
		}
		if st, b := a.do(http.MethodPost, "/v1/hosts/agent-1/activate", a.key, nil, nil); st != http.StatusOK {
			t.Fatalf("activate agent-1: %d %s", st, b)
		}
		if sb := a.create(map[string]any{"host": "agent-1"}); sb.HostID != "agent-1" {
			t.Errorf("create on agent-1 after activate: landed on %s", sb.HostID)
		}
	})

	// What follows moves sandboxes between hosts through the object
	// store: a sandbox's file and a process it runs must come along.
	prepare := func(id string) {
		a.exec(id, "echo moved > /root/mark; setsid sleep 3600 </dev/null >/dev/null 2>&1 & echo $! > /root/pid")
	}
	checkMoved := func(t *testing.T, id string) {
		if got := a.exec(id, "cat /root/mark; kill -0 $(cat /root/pid) && echo alive"); got != "moved\nalive\n" {
			t.Errorf("sandbox %s after the move: got %q, want its file and its running process", id, got)
		}
	}

	t.Run("pause on one host, resume on another", func(t *testing.T) {
		a.t = t
		sb := a.create(map[string]any{"host": "agent-3"})
		prepare(sb.ID)
		if st, b := a.do(http.MethodPost, "/v1/sandboxes/"+sb.ID+"/pause", a.key, nil, nil); st != http.StatusOK {
			t.Fatalf("pause: %d %s", st, b)
		}
		var got sandbox
		if st, b := a.do(http.MethodPost, "/v1/sandboxes/"+sb.ID+"/resume", a.key, map[string]any{"placement": map[string]any{"host": "agent-1"}}, &got); st != http.StatusOK {
			t.Fatalf("resume on agent-1: %d %s", st, b)
		}
		if got.State != "running" || got.HostID != "agent-1" {
			t.Fatalf("resumed on agent-1: %s on %s", got.State, got.HostID)
		}
		checkMoved(t, sb.ID)
	})

	t.Run("drain with migration", func(t *testing.T) {
		a.t = t
		// One sandbox to move: migration moves them one by one.
		for _, sb := range a.list() {
			if sb.HostID == "agent-3" && sb.State == "running" {
				if st, b := a.do(http.MethodDelete, "/v1/sandboxes/"+sb.ID, a.key, nil, nil); st/100 != 2 {
					t.Fatalf("kill %s: %d %s", sb.ID, st, b)
				}
			}
		}
		sb := a.create(map[string]any{"host": "agent-3"})
		prepare(sb.ID)
		var out struct {
			Migrated []struct {
				SandboxID string `json:"sandbox_id"`
				To        string `json:"to"`
			} `json:"migrated"`
			Failed []any `json:"failed"`
		}
		if st, b := a.do(http.MethodPost, "/v1/hosts/agent-3/drain?migrate=true", a.key, nil, &out); st != http.StatusOK || len(out.Failed) > 0 {
			t.Fatalf("drain agent-3 with migration: %d %s", st, b)
		}
		defer a.do(http.MethodPost, "/v1/hosts/agent-3/activate", a.key, nil, nil)
		moved := false
		for _, m := range out.Migrated {
			moved = moved || m.SandboxID == sb.ID && m.To != "agent-3"
		}
		if !moved {
			t.Fatalf("drain agent-3 with migration: %+v, want %s moved", out, sb.ID)
		}
		if got := a.get(sb.ID); got.State != "running" || got.HostID == "agent-3" {
			t.Fatalf("migrated sandbox: %s on %s", got.State, got.HostID)
		}
		checkMoved(t, sb.ID)
	})

	// panda bench cluster's measurement, one round: it runs and reports
	// what it measured (its figures are the benchmark's, not the test's).
	t.Run("bench cluster", func(t *testing.T) {
		// Its lazy-restore round finds hosts without lazy restore (this
		// cluster's agents run without it) and says so.
		res, err := bench.ClusterBench(t.Context(), a.sdk, bench.ClusterOptions{Template: "tiny", MemoryMiB: 256, DirtyMiB: 2, N: 1, LazyDirtyMiB: 70})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Hosts) < 2 || res.SameHostForkFirstExec.N != 1 || res.CrossHostForkFirstExec.N != 1 || res.ResumeElsewhereFirstExec.N != 1 {
			t.Errorf("bench cluster measured %+v", res)
		}
		// The fork's answer comes before the child's first exec answers.
		for _, d := range []struct{ answer, exec bench.Dist }{{res.SameHostForkAnswer, res.SameHostForkFirstExec}, {res.CrossHostForkAnswer, res.CrossHostForkFirstExec}} {
			if d.answer.N != 1 || d.answer.P50 <= 0 || d.answer.P50 > d.exec.P50 {
				t.Errorf("fork answered after %+v, its child's first exec after %+v: want one sample, within the exec's", d.answer, d.exec)
			}
		}
		if res.CrossHostMovedMiBP50 <= 0 || res.CrossHostDirtyMiBP50 <= 0 {
			t.Errorf("cross-host fork moved %v MiB, dirty %v MiB: want both positive", res.CrossHostMovedMiBP50, res.CrossHostDirtyMiBP50)
		}
		if res.CrossHostPulledMiBP50 != res.CrossHostDirectMiBP50 {
			t.Errorf("cross-host fork: %v MiB sent directly, %v MiB of it pulled by the child's host; want it all pulled", res.CrossHostDirectMiBP50, res.CrossHostPulledMiBP50)
		}
		t.Logf("cross-host fork: %v MiB sent directly, %v MiB of it pulled by the child's host", res.CrossHostDirectMiBP50, res.CrossHostPulledMiBP50)
		if res.LazyResumeFirstExec != nil || !strings.Contains(res.LazyNote, "--lazy-restore") {
			t.Errorf("lazy restore rounds on hosts without it: %+v, note %q; want no figures and a note naming --lazy-restore", res.LazyResumeFirstExec, res.LazyNote)
		}
		live, err := a.sdk.List(t.Context(), pandastack.ListOptions{}) // every state but stopped
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range live {
			if sb.Info.Metadata["panda_bench"] != "" {
				t.Errorf("the benchmark left sandbox %s %s", sb.ID, sb.Info.State)
			}
		}

		// Parents made from a snapshot both hosts hold (48 MiB of it):
		// a cross-host fork moves what the parent changed since, through
		// the control plane, the pull and the held snapshots it names.
		res, err = bench.ClusterBench(t.Context(), a.sdk, bench.ClusterOptions{Template: "tiny", MemoryMiB: 256, DirtyMiB: 2, N: 1, EnvMiB: 48})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("from a 48 MiB environment snapshot: cross-host fork moved %v MiB (%v MiB dirty)", res.CrossHostMovedMiBP50, res.CrossHostDirtyMiBP50)
		if res.EnvSnapshot == "" || res.CrossHostMovedMiBP50 <= 0 || res.CrossHostMovedMiBP50 > 24 {
			t.Errorf("cross-host fork of a sandbox made from a 48 MiB snapshot %q both hosts hold moved %v MiB: want what it changed since (a few MiB)", res.EnvSnapshot, res.CrossHostMovedMiBP50)
		}
		if _, err := a.sdk.GetSnapshot(t.Context(), res.EnvSnapshot); err == nil {
			t.Errorf("the benchmark left its environment snapshot %s", res.EnvSnapshot)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		a.t = t
		tok, err := c.JoinToken()
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			what, method, path, auth string
			body                     any
			want                     int
			says                     string // in the error message
		}{
			{"create on an unknown host", http.MethodPost, "/v1/sandboxes", a.key, map[string]any{"placement": map[string]any{"host": "nosuchhost"}}, http.StatusNotFound, "nosuchhost"},
			{"fork onto an unknown host", http.MethodPost, "/v1/sandboxes/" + onTwo.ID + "/fork", a.key, map[string]any{"placement": map[string]any{"host": "nosuchhost"}}, http.StatusNotFound, "nosuchhost"},
			{"drain of an unknown host", http.MethodPost, "/v1/hosts/nosuchhost/drain", a.key, nil, http.StatusNotFound, "nosuchhost"},
			{"activate of an unknown host", http.MethodPost, "/v1/hosts/nosuchhost/activate", a.key, nil, http.StatusNotFound, "nosuchhost"},
			{"join with a wrong join token", http.MethodPost, "/v1/fleet/join", tok + "x", map[string]any{"id": "intruder"}, http.StatusUnauthorized, "join token"},
			{"join with an API key", http.MethodPost, "/v1/fleet/join", a.key, map[string]any{"id": "intruder"}, http.StatusUnauthorized, "join token"},
			{"heartbeat with a wrong join token", http.MethodPost, "/v1/fleet/hosts/agent-1/heartbeat", "wrong", map[string]any{}, http.StatusUnauthorized, "join token"},
			// The join token is right: what is refused is the registration.
			{"join without a URL", http.MethodPost, "/v1/fleet/join", tok, map[string]any{"id": "intruder"}, http.StatusUnprocessableEntity, "url"},
		} {
			if st, b := a.do(tc.method, tc.path, tc.auth, tc.body, nil); st != tc.want || !strings.Contains(b, tc.says) {
				t.Errorf("%s: %d %s, want %d saying %q", tc.what, st, b, tc.want, tc.says)
			}
		}
		if got := len(a.hosts()); got != 3 {
			t.Errorf("hosts after a registration with a wrong token: %d, want 3", got)
		}
	})

	t.Run("host killed", func(t *testing.T) {
		a.t = t
		if onTwo.ID == "" {
			t.Skip("no sandbox on agent-2: placement failed")
		}
		// A paused sandbox of agent-2, once durable in the store,
		// outlives its host.
		paused := a.create(map[string]any{"host": "agent-2"})
		prepare(paused.ID)
		if st, b := a.do(http.MethodPost, "/v1/sandboxes/"+paused.ID+"/pause", a.key, nil, nil); st != http.StatusOK {
			t.Fatalf("pause: %d %s", st, b)
		}
		testkit.WaitFor(t, time.Minute, "paused sandbox "+paused.ID+" durable in the store", func() bool {
			return a.get(paused.ID).Stored == "durable"
		})

		// The key's event stream tells the loss (a record the fleet did
		// not write: the registry re-sends the host's sandboxes).
		evctx, stopEvents := context.WithCancel(context.Background())
		defer stopEvents()
		events, err := a.sdk.Events(evctx)
		if err != nil {
			t.Fatal(err)
		}
		defer events.Close()
		sawLost := make(chan struct{})
		go func() {
			for {
				ev, err := events.Next()
				if err != nil {
					return
				}
				if ev.Type == pandastack.EventSandbox && ev.ID == onTwo.ID && ev.Sandbox != nil && ev.Sandbox.State == pandastack.StateLost {
					close(sawLost)
					return
				}
			}
		}()

		ag := c.Agents()[1]
		vmms := ag.VMMPIDs()
		if len(vmms) == 0 {
			t.Fatalf("agent-2 runs no VMM")
		}
		ag.Kill()
		for _, pid := range vmms {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		killed := time.Now()
		testkit.WaitFor(t, lostAfter+20*time.Second, "sandbox "+onTwo.ID+" of the killed agent-2 shows lost", func() bool {
			return a.get(onTwo.ID).State == "lost"
		})
		t.Logf("lost %v after the kill", time.Since(killed).Round(10*time.Millisecond))
		select {
		case <-sawLost:
		case <-time.After(10 * time.Second):
			t.Errorf("the event stream did not tell that %s was lost", onTwo.ID)
		}
		stopEvents()
		if got := hostState(a.hosts(), "agent-2"); got != "lost" {
			t.Errorf("killed agent-2: state %q, want lost", got)
		}
		if st, b := a.do(http.MethodPost, "/v1/sandboxes", a.key, map[string]any{"placement": map[string]any{"host": "agent-2"}}, nil); st != http.StatusConflict {
			t.Errorf("create on lost agent-2: %d %s, want 409", st, b)
		}
		if st, b := a.do(http.MethodDelete, "/v1/sandboxes/"+onTwo.ID, a.key, nil, nil); st/100 != 2 {
			t.Fatalf("kill of a lost sandbox: %d %s", st, b)
		}
		if got := a.get(onTwo.ID).State; got != "stopped" {
			t.Errorf("lost sandbox after kill: state %s, want stopped", got)
		}
		var got sandbox
		if st, b := a.do(http.MethodPost, "/v1/sandboxes/"+paused.ID+"/resume", a.key, nil, &got); st != http.StatusOK {
			t.Fatalf("resume of a lost host's paused sandbox: %d %s", st, b)
		}
		if got.State != "running" || got.HostID == "agent-2" {
			t.Fatalf("resumed paused sandbox of lost agent-2: %s on %s, want running elsewhere", got.State, got.HostID)
		}
		checkMoved(t, paused.ID)

		// The user template agent-2 built outlives it: listed, created
		// on agent-1 (which fetches it from the object store), deleted
		// (agent-1's and agent-3's copies too); new builds wait for
		// agent-2, the --template-host.
		listsFleetapp(t, "while agent-2 is lost")
		body := map[string]any{"ttl_seconds": 600, "template": "fleetapp", "placement": map[string]any{"host": "agent-1"}}
		var sb sandbox
		if st, out := a.do(http.MethodPost, "/v1/sandboxes", a.key, body, &sb); st != http.StatusCreated && st != http.StatusOK {
			t.Fatalf("create fleetapp on agent-1 while agent-2 is lost: %d %s", st, out)
		}
		if got := a.exec(sb.ID, "cat /root/built"); !strings.HasPrefix(got, "built-on-") {
			t.Errorf("fleetapp's sandbox on agent-1 reads %q, want the build's file", got)
		}
		a.do(http.MethodDelete, "/v1/sandboxes/"+sb.ID, a.key, nil, nil)
		bctx, bcancel := context.WithTimeout(context.Background(), time.Minute)
		defer bcancel()
		if _, err := a.sdk.BuildTemplateFromDockerfile(bctx, "fleetapp", "FROM tiny\n", t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "agent-2") {
			t.Errorf("a build while the --template-host is lost: %v, want an error naming agent-2", err)
		}
		if st, out := a.do(http.MethodDelete, "/v1/templates/fleetapp", a.key, nil, nil); st != http.StatusNoContent {
			t.Fatalf("delete fleetapp while agent-2 is lost: %d %s", st, out)
		}
		for _, i := range []int{0, 2} {
			if m, _ := filepath.Glob(fleetappCopies(i)); len(m) != 0 {
				t.Errorf("agent-%d still holds its copy of the deleted fleetapp: %v", i+1, m)
			}
		}
		if st, out := a.do(http.MethodPost, "/v1/sandboxes", a.key, body, nil); st != http.StatusNotFound {
			t.Errorf("create of a deleted template: %d %s, want 404", st, out)
		}
	})

	t.Run("control plane restart", func(t *testing.T) {
		a.t = t
		var live []sandbox
		for _, sb := range a.list() {
			if sb.State == "running" {
				live = append(live, sb)
			}
		}
		if len(live) == 0 {
			t.Fatal("no running sandbox before the restart")
		}
		oldPID := c.ServerPID()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.RestartServer(ctx); err != nil {
			t.Fatal(err)
		}
		if c.ServerPID() == oldPID {
			t.Fatal("RestartServer kept the old process")
		}
		testkit.WaitFor(t, 30*time.Second, "agent-1 and agent-3 ready after the restart", func() bool {
			hs := a.hosts()
			return len(hs) == 3 && hostState(hs, "agent-1") == "ready" && hostState(hs, "agent-3") == "ready"
		})
		if got := hostState(a.hosts(), "agent-2"); got != "lost" {
			t.Errorf("agent-2 (dead) after the restart: %q, want lost", got)
		}
		for _, sb := range live {
			if got := a.get(sb.ID); got.State != "running" || got.HostID != sb.HostID {
				t.Errorf("sandbox %s after the restart: %s on %s, want running on %s", sb.ID, got.State, got.HostID, sb.HostID)
				continue
			}
			if got := a.exec(sb.ID, "echo "+sb.ID); got != sb.ID+"\n" {
				t.Errorf("exec in %s after the restart: %q", sb.ID, got)
			}
		}
	})
}

// TestKilledRunIsCleanedUp: `panda dev cluster` killed with SIGKILL (its
// agent killed first, so that a VMM, the agent's store mount and the
// namespaces outlive it) is cleaned up by the next cluster of its name;
// a second cluster of a running one's name is refused.
func TestKilledRunIsCleanedUp(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t) // namespaces, XFS stores
	const name = "pdk"
	subnet := netip.MustParsePrefix("10.237.0.0/24")
	bin, gw, addr := binaries(t)
	dataDir, err := os.MkdirTemp("", "pdk-")
	if err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd := exec.Command(bin, "dev", "cluster", "--agents", "1", "--name", name, "--subnet", subnet.String(),
		"--listen", addr, "--data-dir", dataDir, "--images", testkit.Images(),
		"--default-template", "tiny", "--default-memory", "256")
	cmd.Env = append(os.Environ(), "PANDA_VERSITYGW="+gw)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	cfg := devcluster.Config{Agents: 1, Listen: addr, DataDir: dataDir, Images: testkit.Images(), Binary: bin, Versitygw: gw,
		Name: name, Subnet: subnet, Env: os.Environ(), Out: out, ReadyTimeout: 3 * time.Minute,
		AgentArgs: []string{"--default-template", "tiny", "--default-memory", "256"}}
	var second *devcluster.Cluster
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if second == nil { // the test failed before: clean up as the next run would
			if err := devcluster.RemoveLeftovers(cfg); err != nil {
				t.Error(err)
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
		if _, err := pandatest.RemoveDataDir(dataDir); err != nil {
			t.Error(err)
		}
	})
	testkit.WaitFor(t, 3*time.Minute, "panda dev cluster ready", func() bool {
		select {
		case <-exited:
			t.Fatalf("panda dev cluster exited:\n%s", out.String())
		default:
		}
		return strings.Contains(out.String(), "Ctrl-C stops everything.")
	})
	keyFile := filepath.Join(dataDir, "admin.key")
	for _, want := range []string{
		"export PANDASTACK_API_URL=http://" + addr + " PANDASTACK_API_KEY=$(cat " + keyFile + ")",
		"agent-1", "no network",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output does not say %q", want)
		}
	}

	// A second cluster of the name is refused while the first runs.
	if c, err := devcluster.Start(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "running already") {
		if c != nil {
			c.Close()
		}
		t.Fatalf("a second cluster named %s: %v, want refused (running already)", name, err)
	}

	key, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	a := &api{t: t, url: "http://" + addr, key: strings.TrimSpace(string(key))}
	a.create(nil)
	agentDir := filepath.Join(dataDir, "agent-1")
	vmms := testkit.QEMUProcs(agentDir)
	if len(vmms) != 1 {
		t.Fatalf("VMMs of agent-1: %v, want one", vmms)
	}
	agentPID := 0
	for _, pid := range testkit.Procs("agent\x00--data-dir\x00" + agentDir) {
		agentPID = pid
	}
	if agentPID == 0 {
		t.Fatal("no agent-1 process found")
	}
	syscall.Kill(agentPID, syscall.SIGKILL)
	if !testkit.WaitGone(agentPID, 10*time.Second) {
		t.Fatal("agent-1 survives SIGKILL")
	}
	cmd.Process.Kill()
	<-exited
	if !testkit.Alive(vmms[0]) || !testkit.Mounted(filepath.Join(agentDir, "store")) {
		t.Fatalf("after the kills: VMM alive %v, store mounted %v; want both left behind", testkit.Alive(vmms[0]), testkit.Mounted(filepath.Join(agentDir, "store")))
	}
	if _, err := os.Stat("/run/netns/" + name + "-a1"); err != nil {
		t.Fatalf("namespace %s-a1 after the kill: %v, want it left behind", name, err)
	}

	out2 := &syncBuffer{}
	cfg.Out = out2
	second, err = devcluster.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("the next cluster of the name: %v\n%s", err, out2.String())
	}
	if !strings.Contains(out2.String(), "Cleaned up after an earlier run") || testkit.Alive(vmms[0]) {
		t.Errorf("the next cluster: VMM %d alive %v; output:\n%s", vmms[0], testkit.Alive(vmms[0]), out2.String())
	}
	if hs := a.hosts(); len(hs) != 1 || hs[0].State != "ready" {
		t.Errorf("hosts of the next cluster: %+v, want agent-1 ready", hs)
	}
	if err := second.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if m := testkit.Mounted(filepath.Join(agentDir, "store")); m {
		t.Errorf("agent-1's store still mounted after Close")
	}
	if _, err := os.Stat("/run/netns/" + name + "-a1"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace %s-a1 after Close: %v", name, err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "postgres", "data", "PG_VERSION")); err != nil {
		t.Errorf("the kept data directory lost its catalog: %v", err)
	}
}

// binaries are the panda and versitygw binaries the cluster runs and a
// free loopback address for its API.
func binaries(t *testing.T) (bin, gw, addr string) {
	t.Helper()
	var err error
	if bin, err = pandatest.Binary(); err != nil {
		t.Fatal(err)
	}
	if gw, err = s3test.Binary(); err != nil {
		t.Fatal(err)
	}
	if addr, err = pandatest.FreeAddr(); err != nil {
		t.Fatal(err)
	}
	return bin, gw, addr
}
