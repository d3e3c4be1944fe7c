package testkit

import (
	"testing"
	"time"
)

// PollInterval is how often Poll and WaitFor check their condition.
const PollInterval = 10 * time.Millisecond

// Poll calls cond every PollInterval until it returns true or d has
// passed, and reports whether it returned true. Every poll in a test has a
// deadline: a condition that never holds must fail the test, not hang it
// until the test binary's timeout.
func Poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(PollInterval) // polling a condition, bounded by the deadline
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
