package rest

import (
	"context"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// KeySubscribers is how many event streams key (its id) has subscribed.
func (s *Server) KeySubscribers(key string) int { return s.events.KeyLen(key) }

// ResolveTemplate is resolveTemplate: the reference a create of ref by key
// is made from.
func (s *Server) ResolveTemplate(ctx context.Context, key catalog.Key, ref string) (string, error) {
	return s.cp.ResolveTemplate(ctx, key, ref)
}

// GuestSlots is how many guest request slots of sandbox id are taken.
func (s *Server) GuestSlots(id string) int {
	s.guests.mu.Lock()
	defer s.guests.mu.Unlock()
	return s.guests.sandboxes[id]
}

// SetCodeTimeoutGrace sets how long past a cell's timeout the server waits
// for the guest before it ends the cell itself. Call it before serving.
func (s *Server) SetCodeTimeoutGrace(d time.Duration) { s.codeGrace = d }
