package hostagent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// startKeeper is startKeeperOn the test agent.
func startKeeper(t *testing.T, id string) string {
	t.Helper()
	return startKeeperOn(t, testAgent, id)
}

// askKeeper is askKeeperOn the test agent.
func askKeeper(t *testing.T, id, pid string) string {
	t.Helper()
	return askKeeperOn(t, testAgent, id, pid)
}

func fork(t *testing.T, id string, n int) []Info {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = host.NewID()
	}
	res, err := testAgent.Fork(ctxT(t), id, ids)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	var out []Info
	for i, c := range res.Children {
		if c.Err != nil {
			t.Fatalf("child %d: %v", i, c.Err)
		}
		cid := c.Info.ID
		t.Cleanup(func() { testAgent.Kill(context.Background(), cid) })
		out = append(out, c.Info)
	}
	t.Logf("fork of %s: paused %.1f ms, %d MiB dirty in %d runs", id, res.Capture.PausedMS, res.Capture.DirtyBytes>>20, res.Capture.Runs)
	return out
}

func TestForkSharesStateAndIsolatesWrites(t *testing.T) {
	shared(t)
	parent := create(t)
	sh(t, parent.ID, "echo before > /root/file; echo shm > /dev/shm/mem")
	keeper := startKeeper(t, parent.ID)
	secret := askKeeper(t, parent.ID, keeper)
	if len(secret) != 16 {
		t.Fatalf("keeper secret %q", secret)
	}

	children := fork(t, parent.ID, 4)
	for _, c := range children {
		if c.ParentID != parent.ID {
			t.Errorf("child %s parent %q", c.ID, c.ParentID)
		}
		if got := sh(t, c.ID, "cat /root/file /dev/shm/mem; hostname; echo $PANDA_SANDBOX_ID"); got != "before\nshm\n"+c.ID+"\n"+c.ID+"\n" {
			t.Errorf("child %s sees %q", c.ID, got)
		}
		if got := askKeeper(t, c.ID, keeper); got != secret {
			t.Errorf("child %s: keeper process answered %q, want the parent's in-memory %q", c.ID, got, secret)
		}
	}
	// Writes after the fork are private, in both directions, on disk and in RAM.
	a, b := children[0], children[1]
	sh(t, a.ID, "echo child-a > /root/file; echo a > /dev/shm/mem; echo new > /root/only-a")
	sh(t, parent.ID, "echo parent-after > /root/file; echo p > /dev/shm/mem")
	if got := sh(t, b.ID, "cat /root/file /dev/shm/mem; ls /root/only-a 2>&1 || true"); !strings.HasPrefix(got, "before\nshm\n") || !strings.Contains(got, "No such file") {
		t.Errorf("sibling sees %q", got)
	}
	if got := sh(t, parent.ID, "cat /root/file /dev/shm/mem; ls /root/only-a 2>&1 || true"); !strings.HasPrefix(got, "parent-after\np\n") || !strings.Contains(got, "No such file") {
		t.Errorf("parent sees %q", got)
	}
	if got := sh(t, a.ID, "cat /root/file /dev/shm/mem"); got != "child-a\na\n" {
		t.Errorf("child a sees %q", got)
	}
	// Every child and the parent read different random bytes.
	seen := map[string]string{}
	for _, id := range []string{parent.ID, children[0].ID, children[1].ID, children[2].ID, children[3].ID} {
		r := sh(t, id, "head -c 16 /dev/urandom | od -An -tx1")
		if other, dup := seen[r]; dup {
			t.Errorf("%s and %s read the same random bytes", id, other)
		}
		seen[r] = id
		mid := sh(t, id, "cat /etc/machine-id")
		if other, dup := seen[mid]; dup {
			t.Errorf("%s and %s share machine-id %s", id, other, mid)
		}
		seen[mid] = id
	}
}

func TestForkChainTenDeep(t *testing.T) {
	shared(t)
	cur := create(t)
	sh(t, cur.ID, "echo 0 > /root/level-0")
	free0 := testkit.FreeBytes(t, testAgent.StoreDir())
	var dirtied int64
	for level := 1; level <= 10; level++ {
		ids := []string{host.NewID()}
		res, err := testAgent.Fork(ctxT(t), cur.ID, ids)
		if err != nil || res.Children[0].Err != nil {
			t.Fatalf("fork at level %d: %v %v", level, err, res.Children)
		}
		child := res.Children[0].Info
		t.Cleanup(func() { testAgent.Kill(context.Background(), child.ID) })
		dirtied += res.Capture.DirtyBytes
		sh(t, child.ID, fmt.Sprintf("echo %d > /root/level-%d", level, level))
		cur = child
	}
	got := sh(t, cur.ID, "cat /root/level-*")
	want := ""
	for _, l := range []int{0, 1, 10, 2, 3, 4, 5, 6, 7, 8, 9} { // glob order
		want += fmt.Sprintf("%d\n", l)
	}
	if got != want {
		t.Errorf("leaf of the chain sees %q, want %q", got, want)
	}
	used := free0 - testkit.FreeBytes(t, testAgent.StoreDir())
	t.Logf("10-deep chain, all alive: store grew %d MiB; the forks captured %d MiB of dirty memory", used>>20, dirtied>>20)
	// Full copies would be 10 x 256 MiB of memory images alone; allow the
	// dirty pages plus 8 MiB per level for disk writes and metadata.
	if limit := dirtied + 10*8<<20; used > limit {
		t.Errorf("the chain used %d MiB of store, want at most %d MiB", used>>20, limit>>20)
	}
}

func TestStreamSurvivesFork(t *testing.T) {
	shared(t)
	parent := create(t)
	c, err := testAgent.Guest(parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	p, err := c.StartExec(ctx, guestproto.ExecRequest{
		Shell: "i=0; while [ $i -lt 40 ]; do echo line-$i; i=$((i+1)); sleep 0.05; done",
	})
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, p.Stderr)
	br := bufio.NewReader(p.Stdout)
	first, err := br.ReadString('\n')
	if err != nil || first != "line-0\n" {
		t.Fatalf("first line %q, %v", first, err)
	}
	// Fork while the command is streaming.
	fork(t, parent.ID, 1)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("stream after fork: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(first+string(rest)), "\n")
	if len(lines) != 40 || lines[39] != "line-39" {
		t.Errorf("got %d lines ending %q, want 40 ending line-39", len(lines), lines[len(lines)-1])
	}
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Errorf("exit %+v %v", res, err)
	}
}

func TestSnapshotAndCreateFromIt(t *testing.T) {
	shared(t)
	src := create(t)
	sh(t, src.ID, "echo snap > /root/s.txt")
	keeper := startKeeper(t, src.ID)
	secret := askKeeper(t, src.ID, keeper)
	snapID := host.NewID()
	si, err := testAgent.Snapshot(ctxT(t), src.ID, snapID)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testAgent.DeleteSnapshot(snapID) })
	if si.SandboxID != src.ID || si.Spec.MemoryMiB != 256 {
		t.Errorf("snapshot %+v", si)
	}
	// The source runs on and its later writes are not in the snapshot.
	sh(t, src.ID, "echo later > /root/s.txt")
	info, err := testAgent.Create(ctxT(t), CreateRequest{SnapshotID: snapID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testAgent.Kill(context.Background(), info.ID) })
	if got := sh(t, info.ID, "cat /root/s.txt; hostname"); got != "snap\n"+info.ID+"\n" {
		t.Errorf("restored snapshot sees %q", got)
	}
	if got := askKeeper(t, info.ID, keeper); got != secret {
		t.Errorf("keeper in restored snapshot answered %q, want %q", got, secret)
	}
	found := false
	for _, s := range testAgent.Snapshots() {
		found = found || s.ID == snapID
	}
	if !found {
		t.Errorf("Snapshots() lacks %s", snapID)
	}
	// Deleting the snapshot leaves sandboxes made from it running.
	if err := testAgent.DeleteSnapshot(snapID); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, info.ID, "cat /root/s.txt"); got != "snap\n" {
		t.Errorf("after deleting the snapshot: %q", got)
	}
	if _, err := testAgent.Create(ctxT(t), CreateRequest{SnapshotID: snapID}); !errors.Is(err, ErrNotFound) {
		t.Errorf("create from a deleted snapshot: %v, want ErrNotFound", err)
	}
}

func TestPauseResumeThreeTimes(t *testing.T) {
	shared(t)
	sb := create(t)
	sh(t, sb.ID, "echo kept > /root/p.txt")
	keeper := startKeeper(t, sb.ID)
	secret := askKeeper(t, sb.ID, keeper)
	for i := 0; i < 3; i++ {
		before, _ := testAgent.Get(sb.ID)
		if _, err := testAgent.Pause(ctxT(t), sb.ID); err != nil {
			t.Fatalf("pause %d: %v", i, err)
		}
		got, _ := testAgent.Get(sb.ID)
		if got.State != StatePaused || got.PID != 0 {
			t.Errorf("after pause %d: %+v", i, got)
		}
		if err := unix.Kill(before.PID, 0); !errors.Is(err, unix.ESRCH) {
			t.Errorf("paused sandbox's VMM %d still runs", before.PID)
		}
		if _, err := testAgent.Exec(ctxT(t), sb.ID, guestproto.ExecRequest{Shell: "true"}, nil, nil, nil); !errors.Is(err, ErrConflict) {
			t.Errorf("exec while paused: %v, want ErrConflict", err)
		}
		if _, err := testAgent.Pause(ctxT(t), sb.ID); !errors.Is(err, ErrConflict) {
			t.Errorf("pause while paused: %v, want ErrConflict", err)
		}
		if _, err := testAgent.Resume(ctxT(t), sb.ID); err != nil {
			t.Fatalf("resume %d: %v", i, err)
		}
		if got := sh(t, sb.ID, fmt.Sprintf("cat /root/p.txt; echo round-%d >> /root/p.txt; hostname", i)); !strings.HasPrefix(got, "kept\n") || !strings.HasSuffix(got, sb.ID+"\n") {
			t.Errorf("after resume %d: %q", i, got)
		}
		if got := askKeeper(t, sb.ID, keeper); got != secret {
			t.Errorf("after resume %d the keeper answered %q, want %q", i, got, secret)
		}
	}
	if got := sh(t, sb.ID, "cat /root/p.txt"); got != "kept\nround-0\nround-1\nround-2\n" {
		t.Errorf("file after three cycles: %q", got)
	}
	if _, err := testAgent.Resume(ctxT(t), sb.ID); !errors.Is(err, ErrConflict) {
		t.Errorf("resume of a running sandbox: %v, want ErrConflict", err)
	}
}

func TestForkOfPausedSandboxConflicts(t *testing.T) {
	shared(t)
	sb := create(t)
	if _, err := testAgent.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err := testAgent.Fork(ctxT(t), sb.ID, []string{host.NewID()})
	if !errors.Is(err, ErrConflict) {
		t.Errorf("fork of a paused sandbox: %v, want ErrConflict", err)
	}
	if _, err := testAgent.Fork(ctxT(t), "nosuch", []string{host.NewID()}); !errors.Is(err, ErrNotFound) {
		t.Errorf("fork of an unknown sandbox: %v", err)
	}
	_ = time.Second
}

// TestSandboxesHaveTheGuestNetwork: a sandbox, its fork child and the
// sandbox after a pause and resume all have the guests' NIC (same MAC and
// address) and reach their gateway (until host networking is wired, the
// isolated namespace's); none leaves a descriptor in the host agent.
func TestSandboxesHaveTheGuestNetwork(t *testing.T) {
	shared(t)
	fds := testkit.OpenFDs(t)
	parent := create(t)
	check := func(who, id string) {
		t.Helper()
		want := fmt.Sprintf("%s\ninet %s/%d\n", guestnet.GuestMAC, guestnet.GuestIP, guestnet.PrefixLen)
		if got := sh(t, id, "cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | grep -o 'inet [0-9./]*'"); got != want {
			t.Errorf("%s: eth0 %q, want %q", who, got, want)
		}
		sh(t, id, "ping -c 1 -W 5 "+guestnet.GatewayIP)
	}
	check("sandbox", parent.ID)
	child := fork(t, parent.ID, 1)[0]
	check("fork child", child.ID)
	check("parent after the fork", parent.ID)
	if _, err := testAgent.Pause(ctxT(t), parent.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := testAgent.Resume(ctxT(t), parent.ID); err != nil {
		t.Fatal(err)
	}
	check("resumed sandbox", parent.ID)
	for _, id := range []string{child.ID, parent.ID} {
		if err := testAgent.Kill(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if got := testkit.OpenFDs(t); got != fds {
		t.Errorf("the host agent has %d descriptors open, %d before the sandboxes", got, fds)
	}
}
