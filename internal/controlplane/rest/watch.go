package rest

import (
	"net/http"
	"strconv"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
)

// watchDir streams the changes under a directory as NDJSON, one
// guestproto.WatchEvent per line ({"type":"create","path":"/dir/x"}), until
// the client disconnects or the directory is removed. The 200 and its
// headers are sent once the guest's watches are in place. A slow client
// holds back the guest's stream; the guest queues a bounded number of
// events and then sends {"type":"overflow"}.
func (s *Server) watchDir(w http.ResponseWriter, r *http.Request) {
	p, g, ok := s.pathAndGuest(w, r)
	if !ok {
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		var err error
		if recursive, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, r, invalid("recursive must be true or false"))
			return
		}
	}
	dw, ok := g.(host.DirWatcher)
	if !ok {
		s.writeError(w, r, errorf(controlplane.NotImplemented, "this sandbox's host cannot watch directories"))
		return
	}
	watch, err := dw.WatchDir(r.Context(), p, recursive)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer watch.Close()
	out := newNDJSON(w)
	for {
		ev, err := watch.Next()
		if err != nil {
			return // the client went away, or the directory was removed
		}
		if out.send(ev) != nil {
			return
		}
	}
}
