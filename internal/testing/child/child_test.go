package child

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// helperEnv makes the test binary the helper parent of
// TestDiesWithParent.
const helperEnv = "CHILD_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		// The helper: start a child, say its PID, wait to be killed.
		cmd := exec.Command("sleep", "60")
		if _, err := Start(cmd, syscall.SIGKILL); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		select {}
	}
	os.Exit(m.Run())
}

// TestSurvivesThreadExits: goroutines that lock their threads and return
// (the threads end) do not set off the child's parent-death signal.
func TestSurvivesThreadExits(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	done, err := Start(cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	for range 50 {
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		}()
		<-exited
	}
	select {
	case err := <-done:
		t.Fatalf("the child exited while its parent lives: %v", err)
	case <-time.After(200 * time.Millisecond): // a signal would have arrived by now
	}
	cmd.Process.Kill()
	<-done
}

// TestDiesWithParent: the child of a process that is killed gets the
// signal.
func TestDiesWithParent(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	helper := exec.Command(exe)
	helper.Env = append(os.Environ(), helperEnv+"=1")
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil || pid <= 0 {
		helper.Process.Kill()
		helper.Wait()
		t.Fatalf("helper said %q (%v)", line, err)
	}
	if !testkit.Alive(pid) {
		t.Fatalf("child %d is not running", pid)
	}
	helper.Process.Kill()
	helper.Wait()
	if !testkit.WaitGone(pid, 10*time.Second) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("child %d still runs 10 s after its parent was killed", pid)
	}
}
