package pandastack

import (
	"context"
	"net/http"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// Network is a sandbox's egress policy: what the sandbox may connect to.
// Entries of AllowOut and DenyOut are IPv4 addresses ("203.0.113.7"),
// CIDRs ("203.0.113.0/24"), domain names ("example.com", exactly that
// name) or wildcards ("*.example.com", the names below it, not
// example.com itself).
//
// Internet true allows everything but DenyOut; Internet false denies
// everything but AllowOut; AllowOut wins over DenyOut. So the zero Network
// denies everything. Whatever the policy, the server blocks the host,
// other sandboxes, link-local addresses (cloud metadata) and the host's
// private networks unless its operator allowed them. Names are enforced by
// the sandbox's DNS resolver: a denied name does not resolve, an allowed
// name's addresses are allowed for their DNS TTL.
//
// The server checks the entries: a bad one is an ErrBadRequest whose
// message names it.
type Network struct {
	Internet bool     `json:"internet"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// NetworkUpdate changes some fields of a sandbox's Network: each field
// that is not nil replaces the sandbox's, the others stay as they are. A
// pointer to an empty list empties that list.
//
//	sb.SetNetwork(ctx, pandastack.NetworkUpdate{Internet: new(false), AllowOut: &[]string{"pypi.org"}})
type NetworkUpdate struct {
	Internet *bool     `json:"internet,omitempty"`
	AllowOut *[]string `json:"allow_out,omitempty"`
	DenyOut  *[]string `json:"deny_out,omitempty"`
}

// SetNetwork changes the sandbox's egress policy as u says and updates
// Info (Info.Network is the resulting policy). A running sandbox's rules
// change at once, established connections stay up; a paused sandbox's
// apply when it resumes. A stopped sandbox is ErrConflict.
func (s *Sandbox) SetNetwork(ctx context.Context, u NetworkUpdate) error {
	// A pointer to a nil list would encode as null, which the server
	// reads as "not given": send the empty list it stands for.
	for _, l := range []**[]string{&u.AllowOut, &u.DenyOut} {
		if *l != nil && **l == nil {
			*l = &[]string{}
		}
	}
	body := wire.SetNetworkJSONRequestBody{Internet: u.Internet, AllowOut: u.AllowOut, DenyOut: u.DenyOut}
	return s.update(ctx, http.MethodPatch, path("sandboxes", s.ID, "network"), body)
}
