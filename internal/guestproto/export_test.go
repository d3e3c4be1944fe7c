package guestproto

import "context"

// Test hooks into unexported state, for the external tests.

func (c *Client) OpenForTest(ctx context.Context, req *OpenRequest) (*Stream, error) {
	return c.open(ctx, req)
}

func (c *Client) WaitReplyForTest(s *Stream) (Reply, error) { return c.waitFrame(s, s.reply, "REPLY") }
func (c *Client) WaitExitForTest(s *Stream) (Reply, error)  { return c.waitFrame(s, s.exit, "EXIT") }

func (s *Stream) ReadStderrForTest(p []byte) (int, error) { return s.read(1, p) }

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
