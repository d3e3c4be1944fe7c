package hostclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// Watcher receives what the agent's event stream says.
type Watcher struct {
	// Connected is called on every (re)connection, once the stream is
	// live: reconcile with List here, since events sent while
	// the stream was down are lost. An error drops the stream and retries,
	// once the exits the stream already carries are taken (see
	// drainAfterConnectError).
	Connected func(ctx context.Context) error
	// Exited is called when a sandbox stopped without being killed
	// through the API: its VMM exited, or (err wraps host.ErrHostShutdown)
	// the agent stopped it as it shut down. Same contract as
	// the host agent's OnExit (hostagent.Config).
	Exited func(id string, err error)
}

// Watch follows the agent's event stream until ctx ends, reconnecting
// with backoff (100 ms doubling to 5 s while connecting fails; back to
// 100 ms once a stream was live) whenever it breaks or stays silent for
// three ping intervals. It returns nil when ctx ends.
func (c *Client) Watch(ctx context.Context, w Watcher) error {
	backoff := 100 * time.Millisecond
	for {
		live, err := c.watchOnce(ctx, w)
		if ctx.Err() != nil {
			return nil
		}
		if live {
			// The agent restarted or the stream broke: while the stream
			// is down, exits are missed, so come back at once.
			backoff = 100 * time.Millisecond
		}
		c.log.Warn("host agent event stream lost; reconnecting", "err", err, "retry_ms", backoff.Milliseconds())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// watchOnce follows one event stream until it ends; live says whether it
// got as far as the agent's hello.
func (c *Client) watchOnce(ctx context.Context, w Watcher) (live bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.request(ctx, http.MethodGet, "/events", nil, nil)
	if err != nil {
		return false, err
	}
	res, err := c.do(req)
	if err != nil {
		return false, err
	}
	defer res.Body.Close()
	// Silence for three pings: the agent or the network is gone.
	idle := time.AfterFunc(3*hostwire.PingInterval, cancel)
	defer idle.Stop()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	hello := false
	var connErr error // Connected's: the stream is drained, then dropped
	for sc.Scan() {
		if connErr == nil {
			idle.Reset(3 * hostwire.PingInterval)
		}
		var ev hostwire.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return hello, fmt.Errorf("event stream: %w", err)
		}
		switch {
		case ev.Type == hostwire.EventHello && ev.Info != nil && !hello:
			c.setInfo(*ev.Info)
			hello = true
			if w.Connected != nil {
				idle.Stop() // however long reconciling takes
				if err := w.Connected(ctx); err != nil {
					connErr = fmt.Errorf("on connect: %w", err)
					time.AfterFunc(drainAfterConnectError, cancel)
					continue
				}
				idle.Reset(3 * hostwire.PingInterval)
			}
		case ev.Type == hostwire.EventExit && hello && w.Exited != nil:
			var cause error
			if ev.Reason == hostwire.ReasonShutdown {
				cause = fmt.Errorf("%w: %s", host.ErrHostShutdown, ev.Error)
			} else if ev.Error != "" {
				cause = errors.New(ev.Error)
			}
			w.Exited(ev.ID, cause)
		}
	}
	if connErr != nil {
		return hello, connErr
	}
	if err := sc.Err(); err != nil {
		return hello, c.transportError(ctx, err)
	}
	return hello, errors.New("event stream ended")
}

// drainAfterConnectError is how long a stream whose Connected failed is
// still read, for its exits, before it is dropped. Connected fails most
// often because the agent is shutting down (its reconcile is refused):
// the agent has seen this stream subscribe and sends on it the
// host_shutdown exits of the sandboxes it stops, then ends it; dropping
// it at once lost them, and the next reconcile recorded those sandboxes
// as exited by themselves.
const drainAfterConnectError = 5 * time.Second
