package lifecycle

import (
	"errors"
	"testing"
)

func TestNext(t *testing.T) {
	tests := []struct {
		from State
		ev   Event
		want State
	}{
		{Starting, Started, Running},
		{Starting, Stop, Stopping},
		{Starting, StopDone, Stopped},
		{Running, Pause, Pausing},
		{Running, Stop, Stopping},
		{Pausing, PauseDone, Paused},
		{Pausing, PauseFailed, Running},
		{Pausing, Stop, Stopping},
		{Paused, Resume, Resuming},
		{Paused, Stop, Stopping},
		{Resuming, ResumeDone, Running},
		{Resuming, ResumeFailed, Paused},
		{Resuming, Stop, Stopping},
		{Stopping, StopDone, Stopped},
	}
	allowed := map[State]map[Event]bool{}
	for _, tt := range tests {
		got, err := Next(tt.from, tt.ev)
		if err != nil || got != tt.want {
			t.Errorf("Next(%s, %s) = %s, %v; want %s", tt.from, tt.ev, got, err, tt.want)
		}
		if allowed[tt.from] == nil {
			allowed[tt.from] = map[Event]bool{}
		}
		allowed[tt.from][tt.ev] = true
	}
	// Everything not listed above is refused, with the state unchanged.
	events := []Event{Started, Pause, PauseDone, PauseFailed, Resume, ResumeDone, ResumeFailed, Stop, StopDone}
	for _, from := range States {
		for _, ev := range events {
			if allowed[from][ev] {
				continue
			}
			got, err := Next(from, ev)
			var te *TransitionError
			if !errors.As(err, &te) || got != from {
				t.Errorf("Next(%s, %s) = %s, %v; want %s and a TransitionError", from, ev, got, err, from)
			}
			if Can(from, ev) {
				t.Errorf("Can(%s, %s) = true", from, ev)
			}
		}
	}
}

func TestStoppedIsFinalAndEveryLiveStateCanStop(t *testing.T) {
	for _, s := range Live {
		if s == Stopping {
			if !Can(s, StopDone) {
				t.Errorf("stopping cannot finish")
			}
			continue
		}
		if !Can(s, Stop) {
			t.Errorf("%s cannot stop", s)
		}
	}
	for _, ev := range []Event{Started, Pause, Resume, Stop, StopDone} {
		if Can(Stopped, ev) {
			t.Errorf("stopped accepts %s", ev)
		}
	}
}

func TestValid(t *testing.T) {
	for _, s := range States {
		if !s.Valid() {
			t.Errorf("%s not valid", s)
		}
	}
	if State("frozen").Valid() {
		t.Error("frozen is valid")
	}
}
