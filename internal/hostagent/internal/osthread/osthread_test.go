package osthread

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// TestDisposableThread: fn runs on a thread that is thrown away (a thread
// is never used twice), never on the main thread (which the runtime cannot
// throw away: the process's /proc/self would show what fn changed).
func TestDisposableThread(t *testing.T) {
	testkit.Root(t)
	mine, _ := os.Readlink("/proc/self/ns/mnt")
	var mu sync.Mutex
	tids := map[int]bool{}
	for i := 0; i < 50; i++ {
		err := Disposable(func() error {
			tid := unix.Gettid()
			mu.Lock()
			defer mu.Unlock()
			if tid == unix.Getpid() {
				return errors.New("ran on the main thread")
			}
			if tids[tid] {
				return fmt.Errorf("thread %d used twice", tid)
			}
			tids[tid] = true
			return unix.Unshare(unix.CLONE_NEWNS)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if now, _ := os.Readlink("/proc/self/ns/mnt"); now != mine {
		t.Errorf("the process's mount namespace changed from %s to %s", mine, now)
	}
}
