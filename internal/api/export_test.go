package api

// EventSubscribers is how many event streams are subscribed.
func (s *Server) EventSubscribers() int { return s.events.Len() }

// GuestSlots is how many guest request slots of sandbox id are taken.
func (s *Server) GuestSlots(id string) int {
	s.guests.mu.Lock()
	defer s.guests.mu.Unlock()
	return s.guests.sandboxes[id]
}
