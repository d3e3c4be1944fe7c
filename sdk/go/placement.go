package pandastack

import (
	"encoding/json"
	"fmt"
)

// Placement says which host of a fleet new sandboxes go to (the
// "placement" of a create or fork). The zero value lets the server choose:
// a create goes to the best host (its template's memory image already
// there, then the most free memory), a fork's children stay on their
// parent's host while it has room. The host a sandbox got is
// SandboxInfo.HostID; Client.Hosts lists the hosts. See docs/scheduling.md.
type Placement struct {
	// Host puts every sandbox on this host (an id from Client.Hosts); the
	// request fails, with a message that says which, if the host is
	// unknown, draining or lost, or has no room for them all.
	Host string
	// Spread puts a fork's children round-robin over the ready hosts with
	// room, the parent's host first.
	Spread bool
}

// OnHost is the Placement that puts new sandboxes on the host id.
func OnHost(id string) Placement { return Placement{Host: id} }

// Spread is the Placement that spreads a fork's children over hosts.
func Spread() Placement { return Placement{Spread: true} }

// IsZero reports whether p leaves the choice to the server.
func (p Placement) IsZero() bool { return p == Placement{} }

// check rejects a Placement the API has no form for, before a request.
func (p Placement) check() error {
	if p.Host != "" && p.Spread {
		return newError(0, CodeInvalid, fmt.Sprintf("placement names host %q and asks to spread: choose one", p.Host))
	}
	return nil
}

// MarshalJSON writes p in its wire form: "auto" (the zero value),
// "spread" or {"host": "ID"}.
func (p Placement) MarshalJSON() ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	switch {
	case p.Host != "":
		return json.Marshal(struct {
			Host string `json:"host"`
		}{p.Host})
	case p.Spread:
		return []byte(`"spread"`), nil
	}
	return []byte(`"auto"`), nil
}

// UnmarshalJSON reads the wire forms MarshalJSON writes, plus null (the
// zero value) and {"spread": true}.
func (p *Placement) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		switch s {
		case "auto":
			*p = Placement{}
		case "spread":
			*p = Placement{Spread: true}
		default:
			return fmt.Errorf(`placement %q is not one of "auto", "spread" or {"host": "HOST_ID"}`, s)
		}
		return nil
	}
	var o struct {
		Host   string `json:"host"`
		Spread bool   `json:"spread"`
	}
	if err := json.Unmarshal(b, &o); err != nil {
		return fmt.Errorf(`placement %s is not one of "auto", "spread" or {"host": "HOST_ID"}`, b)
	}
	q := Placement{Host: o.Host, Spread: o.Spread}
	if err := q.check(); err != nil {
		return err
	}
	*p = q
	return nil
}
