package api

// EventSubscribers is how many event streams are subscribed.
func (s *Server) EventSubscribers() int { return s.events.Len() }
