package storesync

import (
	"context"
	"errors"
	"testing"
	"time"
)

func newTestSync(giveUp func(error) bool) *Sync {
	return New(Config{Retry: time.Microsecond, GiveUp: giveUp})
}

// wait waits for j to end, or fails the test after a minute.
func wait(t *testing.T, j *Job) {
	t.Helper()
	select {
	case <-j.Done():
	case <-time.After(time.Minute):
		t.Fatal("job did not end")
	}
}

// TestChainedJobsRunOneAfterTheOther: a job chained after another of the
// same key starts only once that one has ended; one not chained is not
// started at all while the first runs.
func TestChainedJobsRunOneAfterTheOther(t *testing.T) {
	s := newTestSync(nil)
	defer s.Stop()
	release := make(chan struct{})
	firstIn := make(chan struct{})
	var order []string
	s.Start("k", KindUpload, "first", false, func(ctx context.Context) error {
		close(firstIn)
		<-release
		order = append(order, "first")
		return nil
	})
	<-firstIn
	first := s.Job("k")
	ran := false
	s.Start("k", KindUpload, "ignored", false, func(context.Context) error { ran = true; return nil })
	s.Start("k", KindDelete, "second", true, func(context.Context) error {
		order = append(order, "second")
		return nil
	})
	second := s.Job("k")
	if second == first || second.Kind() != KindDelete {
		t.Fatalf("job of k after chaining: kind %q, same as the first: %v; want the chained delete", second.Kind(), second == first)
	}
	close(release)
	wait(t, second)
	if ran {
		t.Error("a job not chained started while another of its key ran")
	}
	if got, want := len(order), 2; got != want || order[0] != "first" || order[1] != "second" {
		t.Errorf("jobs ran in order %v, want [first second]", order)
	}
	if !s.Idle() {
		t.Error("jobs still listed after all ended")
	}
}

// TestRetryKeepsTheLastErrorAndGivesUp: a failing job is tried again, its
// last failure is LastError, a success clears it, and a failure GiveUp
// names ends the job without success.
func TestRetryKeepsTheLastErrorAndGivesUp(t *testing.T) {
	errHopeless := errors.New("hopeless")
	s := newTestSync(func(err error) bool { return errors.Is(err, errHopeless) })
	defer s.Stop()

	errFlaky := errors.New("flaky")
	tries := 0
	s.Start("ok", KindUpload, "flaky", false, func(context.Context) error {
		tries++
		if tries < 3 {
			return errFlaky
		}
		return nil
	})
	wait(t, s.Job("ok"))
	if tries != 3 {
		t.Errorf("tried %d times, want 3", tries)
	}
	if err := s.LastError("ok"); err != nil {
		t.Errorf("LastError after success = %v, want nil", err)
	}

	gaveUp := 0
	s.Start("bad", KindUpload, "hopeless", false, func(context.Context) error {
		gaveUp++
		return errHopeless
	})
	wait(t, s.Job("bad"))
	if gaveUp != 1 {
		t.Errorf("a job GiveUp names ran %d times, want 1", gaveUp)
	}
	if err := s.LastError("bad"); !errors.Is(err, errHopeless) {
		t.Errorf("LastError = %v, want %v", err, errHopeless)
	}
}

// TestCancelJobAndStop: CancelJob ends a job of its kind only, and after
// Stop no job starts.
func TestCancelJobAndStop(t *testing.T) {
	s := newTestSync(nil)
	in := make(chan struct{})
	s.Start("k", KindFetch, "blocked", false, func(ctx context.Context) error {
		close(in)
		<-ctx.Done()
		return ctx.Err()
	})
	<-in
	if s.CancelJob("k", KindUpload) {
		t.Error("CancelJob of another kind cancelled the job")
	}
	if !s.CancelJob("k", KindFetch) {
		t.Error("CancelJob found no job of its kind")
	}
	if !s.Idle() {
		t.Error("a cancelled job is still listed")
	}
	s.Stop()
	s.Start("k", KindUpload, "after stop", false, func(context.Context) error { return nil })
	if j := s.Job("k"); j != nil {
		t.Error("a job started after Stop")
	}
}
