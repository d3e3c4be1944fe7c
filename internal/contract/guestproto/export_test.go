package guestproto

import (
	"context"
	"io"
)

// Test hooks into unexported state, for the external tests.

// OpenForTest opens a stream that may carry DATA to the host on both
// channels, with no deadline.
func (c *Client) OpenForTest(ctx context.Context, req *OpenRequest) (*Stream, error) {
	s, err := c.open(ctx, req, 2)
	if err == nil {
		s.setDeadline(0, nil)
	}
	return s, err
}

func (c *Client) WaitReplyForTest(s *Stream) (Reply, error) { return c.waitFrame(s, s.reply, "REPLY") }
func (c *Client) WaitExitForTest(s *Stream) (Reply, error)  { return c.waitFrame(s, s.exit, "EXIT") }

func (s *Stream) ReadStderrForTest(p []byte) (int, error) { return s.read(1, p, nil) }

func (s *Stream) CreditForTest(ch int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tx[ch].credit
}

func (s *Stream) BufferedForTest(ch int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rx[ch].n
}

func (a *Agent) GatedForTest() bool  { return a.w.isGated() }
func (a *Agent) StreamsForTest() int { return a.m.count() }

func (s *Stream) UnackedForTest(ch int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rx[ch].unacked
}

func (c *Client) StreamsForTest() int { return c.m.count() }

// BufferCapForTest is the memory the buffered DATA of channel ch holds.
func (s *Stream) BufferCapForTest(ch int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.rx[ch].chunks {
		n += cap(c)
	}
	return n
}

// DecodeListingForTest is the host's listing decoder.
func DecodeListingForTest(r io.Reader, dir string, maxEntries, maxBytes int) ([]FileInfo, error) {
	return decodeListing(r, dir, maxEntries, maxBytes)
}
