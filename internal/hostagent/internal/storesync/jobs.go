package storesync

import (
	"context"
	"errors"
	"time"

	"github.com/pandastack/pandastack/internal/storage/chunkstore"
)

// Job is one background upload, delete or fetch of a set (or the
// store's garbage collection), run by Start.
type Job struct {
	kind   string // KindUpload, KindDelete, KindFetch or KindGC
	cancel context.CancelFunc
	done   chan struct{}
	prev   *Job // the job of the same set it was chained after (nil: none)
}

// Kind is the job's kind.
func (j *Job) Kind() string { return j.kind }

// Done is closed once the job has ended.
func (j *Job) Done() <-chan struct{} { return j.done }

// The kinds of job.
const (
	KindUpload = "upload"
	KindDelete = "delete"
	KindFetch  = "fetch" // of a template (StartTemplateFetch)
	KindGC     = "gc"    // of key GCKey
)

// GCKey is the job key of the store's garbage collection (not a set's).
const GCKey = "gc"

// Lock and Unlock guard the jobs and their errors. A caller that must
// check something of its own and start or cancel a job as one step holds
// the lock around both (StartLocked, JobLocked, ClearErrorLocked). It is
// never held across I/O on the object store.
func (s *Sync) Lock()   { s.mu.Lock() }
func (s *Sync) Unlock() { s.mu.Unlock() }

// Start is StartLocked with the lock taken.
func (s *Sync) Start(key, kind, what string, chain bool, f func(context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.StartLocked(key, kind, what, chain, f)
}

// StartLocked runs f in the background as the job of the set key, tried
// again (retry) until it succeeds or is cancelled. If a job of key
// exists: with chain, the new one starts once it has ended (so that the
// uploads and deletes of one set never overlap); without, StartLocked
// does nothing. Nothing starts once Stop was called. Called with the
// lock held.
func (s *Sync) StartLocked(key, kind, what string, chain bool, f func(context.Context) error) {
	prev := s.jobs[key]
	if s.bgCtx.Err() != nil || (prev != nil && !chain) {
		return
	}
	ctx, cancel := context.WithCancel(s.bgCtx)
	j := &Job{kind: kind, cancel: cancel, done: make(chan struct{}), prev: prev}
	// Every job before this one, not only the last: one cancelled while it
	// waited ends before those it waited for.
	var before []chan struct{}
	for p := prev; p != nil; p = p.prev {
		before = append(before, p.done)
	}
	s.jobs[key] = j
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer close(j.done)
		defer cancel()
		for _, done := range before {
			select {
			case <-done:
			case <-ctx.Done():
			}
		}
		if ctx.Err() == nil {
			s.retry(ctx, key, what, f)
		}
		s.mu.Lock()
		if s.jobs[key] == j {
			delete(s.jobs, key)
			for p := prev; p != nil; p = p.prev {
				if !closed(p.done) {
					s.jobs[key] = p // cancelled while waiting: one before still runs
					break
				}
			}
		}
		j.prev = nil // all before it have ended, or are reached from s.jobs[key]
		s.mu.Unlock()
	}()
}

// Job is the job of key (nil: none runs).
func (s *Sync) Job(key string) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.jobs[key]
}

// JobLocked is Job with the lock held.
func (s *Sync) JobLocked(key string) *Job { return s.jobs[key] }

// Idle reports whether no job runs.
func (s *Sync) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.jobs) == 0
}

// CancelJob cancels the job of key if it is of kind and waits for it to
// end; it returns whether there was one.
func (s *Sync) CancelJob(key, kind string) bool {
	s.mu.Lock()
	j := s.jobs[key]
	if j == nil || j.kind != kind {
		s.mu.Unlock()
		return false
	}
	j.cancel()
	s.mu.Unlock()
	<-j.done
	return true
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// LastError is why the last attempt of the job of key failed (nil if it
// did not, or none ran).
func (s *Sync) LastError(key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errs[key]
}

// ClearErrorLocked forgets the last error of the job of key; called with
// the lock held.
func (s *Sync) ClearErrorLocked(key string) { delete(s.errs, key) }

// retry runs f until it succeeds or ctx ends, waiting between attempts
// (Config.Retry, doubling to 32 times that). The last failure is kept
// for LastError. A failure Config.GiveUp reports ends it at once.
func (s *Sync) retry(ctx context.Context, key, what string, f func(context.Context) error) {
	wait := s.cfg.Retry
	for {
		err := f(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		if err == nil {
			delete(s.errs, key)
		} else {
			s.errs[key] = err
		}
		s.mu.Unlock()
		if err == nil {
			return
		}
		if s.cfg.GiveUp != nil && s.cfg.GiveUp(err) { // trying again cannot help
			s.log.Warn(what+" given up", "set", key, "err", err)
			return
		}
		if errors.Is(err, chunkstore.ErrBusy) { // another's upload: nothing is wrong
			s.log.Info(what+" put off; will retry", "retry_in_ms", wait.Milliseconds(), "reason", err)
		} else {
			s.log.Warn(what+" failed; will retry", "set", key, "retry_in_ms", wait.Milliseconds(), "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, 32*s.cfg.Retry)
	}
}

// StartGC asks for a collection of the store's garbage, the chunks no
// manifest references, in the background: one runs at a time, tried
// again (retry) while an upload of this host or another holds it off
// (chunkstore.ErrBusy) or the store is down. A request made while one
// runs is served by the next, unless one that began after it succeeded.
func (s *Sync) StartGC() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gcAsked++
	asked := s.gcAsked
	s.StartLocked(GCKey, KindGC, "object store garbage collection", true, func(ctx context.Context) error {
		s.mu.Lock()
		served, began := s.gcDone >= asked, s.gcAsked
		s.mu.Unlock()
		if served {
			return nil
		}
		n, err := s.cfg.Store.GC(ctx)
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.gcDone = max(s.gcDone, began)
		s.mu.Unlock()
		if n > 0 {
			s.log.Info("object store garbage collection", "chunks_removed", n)
		}
		return nil
	})
}

// Stop cancels the jobs and waits for them to end (they are started
// again at the host's next start); none starts after it. Idempotent.
func (s *Sync) Stop() {
	s.mu.Lock()
	s.bgCancel()
	s.mu.Unlock()
	s.bg.Wait()
}
