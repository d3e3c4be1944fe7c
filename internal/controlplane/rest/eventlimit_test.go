package rest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/rest"
)

// eventsStatus opens key's event stream, closes it at once, and returns
// the answer's status.
func eventsStatus(t *testing.T, key string) int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// A key has at most api.DefaultMaxEventStreamsPerKey event streams open:
// one more is 429, another key's still opens, and a closed one frees its
// place (issue 31, finding 12).
func TestEventStreamsPerKey(t *testing.T) {
	world(t)
	hog, other := newKey(t, "events-hog", nil), newKey(t, "events-other", nil)
	var open []*eventStream
	for range rest.DefaultMaxEventStreamsPerKey {
		open = append(open, openEvents(t, e.url, hog))
	}
	if st := eventsStatus(t, hog); st != 429 {
		t.Errorf("stream %d of one key: %d, want 429", rest.DefaultMaxEventStreamsPerKey+1, st)
	}
	openEvents(t, e.url, other).close()
	// A closed stream frees its place once the server notices.
	open[0].close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := eventsStatus(t, hog)
		if st == 200 {
			break
		}
		if st != 429 || time.Now().After(deadline) {
			t.Fatalf("after closing a stream: %d, want 200 within 30 s", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
