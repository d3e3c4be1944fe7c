package rest_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// Another key's requests naming a sandbox take none of its guest slots:
// each is 404 before a slot is taken or a byte of its body read, even
// while its body never ends, and the owner's requests go through
// (issue 31, finding 9).
func TestGuestSlotsNeedOwnership(t *testing.T) {
	world(t)
	alice := newKey(t, "slots-owner", nil)
	bob := newKey(t, "slots-other", nil)
	sb := create(t, alice, nil)
	base := e.url + "/v1/sandboxes/" + sb.ID
	// Every kind of route behind the guest limit, with a body or not.
	routes := []struct{ method, path string }{
		{"POST", "/exec/stream"}, {"POST", "/exec"}, {"PUT", "/files?path=/tmp/x"}, {"POST", "/files/mkdir"},
		{"POST", "/processes"}, {"POST", "/processes/1/stdin"}, {"GET", "/files?path=/etc/hostname"},
		{"GET", "/watch?path=/tmp"}, {"GET", "/ports"}, {"GET", "/processes/1/tty"},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 2*guestLimit + len(routes)
	answers := make(chan int, n)
	for i := range n {
		rt := routes[i%len(routes)]
		var body io.Reader
		if rt.method != "GET" {
			pr, pw := io.Pipe() // a body that never ends: nothing is ever written
			defer pw.Close()
			body = pr
		}
		req, err := http.NewRequestWithContext(ctx, rt.method, base+rt.path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+bob)
		go func() {
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- -1
				return
			}
			res.Body.Close()
			answers <- res.StatusCode
		}()
	}
	got := map[int]int{}
	deadline := time.After(20 * time.Second)
collect:
	for range n {
		select {
		case st := <-answers:
			got[st]++
		case <-deadline:
			break collect
		}
	}
	if got[404] != n {
		t.Errorf("another key's %d requests with endless bodies: answers %v (-1: none), want all %d answered 404 at once", n, got, n)
	}
	if held := e.srv.GuestSlots(sb.ID); held != 0 {
		t.Errorf("another key's requests hold %d of the sandbox's %d slots", held, guestLimit)
	}
	if x := run(t, alice, sb.ID, map[string]any{"cmd": "echo mine"}); x.Stdout != "mine\n" {
		t.Errorf("the owner's exec meanwhile: %+v", x)
	}
}
