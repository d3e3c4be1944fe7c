package testkit

import (
	"testing"
	"time"
)

// Poll intervals: the first check after 10 ms, then each wait 1.5 times
// the last, up to 100 ms (a condition that holds soon is seen soon; one
// that takes seconds costs few checks).
const (
	firstInterval = 10 * time.Millisecond
	maxInterval   = 100 * time.Millisecond
)

// Poll calls cond until it returns true or d has passed, and reports
// whether it returned true. Every poll in a test has a
// deadline: a condition that never holds must fail the test, not hang it
// until the test binary's timeout.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	interval := firstInterval
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval) // polling a condition, bounded by the deadline
		interval = min(interval*3/2, maxInterval)
	}
	return true
}

// WaitFor polls cond (Poll) and fails the test, saying what it waited
// for, when cond does not hold within d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("%s: not within %v", what, d)
	}
}

// WaitForf is WaitFor whose message is made when it fails: what() may
// describe the state that was last seen.
func WaitForf(t testing.TB, d time.Duration, what func() string, cond func() bool) {
	t.Helper()
	if !Poll(d, cond) {
		t.Fatalf("%s: not within %v", what(), d)
	}
}
