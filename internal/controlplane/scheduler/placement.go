package scheduler

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// The wire forms of a Placement, as the REST API takes them in the
// "placement" member of a create or fork body:
//
//	absent, null, "auto"     the zero Placement: the scheduler chooses
//	"spread"                 Spread
//	{"host": "ID"}           Host
//	{"spread": true}         Spread ({"spread": false} is the zero Placement)
//
// Anything else is an error whose message says what is accepted.
const placementForms = `"auto", "spread" or {"host": "HOST_ID"}`

// MarshalJSON writes p in its shortest wire form: "auto", "spread" or
// {"host": "ID"}. A Placement naming a host and asking to spread has no
// wire form (an error).
func (p Placement) MarshalJSON() ([]byte, error) {
	switch {
	case p.Host != "" && p.Spread:
		return nil, fmt.Errorf("placement names host %q and asks to spread: choose one", p.Host)
	case p.Host != "":
		return json.Marshal(struct {
			Host string `json:"host"`
		}{p.Host})
	case p.Spread:
		return []byte(`"spread"`), nil
	}
	return []byte(`"auto"`), nil
}

// UnmarshalJSON reads any wire form of a Placement (see placementForms);
// null leaves p as it is, as for every JSON value.
func (p *Placement) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		return nil
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("placement: %w", err)
		}
		switch s {
		case "auto":
			*p = Placement{}
		case "spread":
			*p = Placement{Spread: true}
		default:
			return fmt.Errorf("placement %q is not one of %s", s, placementForms)
		}
		return nil
	case len(b) > 0 && b[0] == '{':
		var o map[string]json.RawMessage
		if err := json.Unmarshal(b, &o); err != nil {
			return fmt.Errorf("placement: %w", err)
		}
		var (
			host   string
			spread bool
		)
		for _, k := range slices.Sorted(maps.Keys(o)) {
			v := o[k]
			var err error
			switch k {
			case "host":
				if err = json.Unmarshal(v, &host); err != nil || host == "" {
					return fmt.Errorf("placement host must be a host's id (a non-empty string), not %s", clip(v))
				}
			case "spread":
				if err = json.Unmarshal(v, &spread); err != nil || bytes.Equal(v, []byte("null")) {
					return fmt.Errorf("placement spread must be true or false, not %s", clip(v))
				}
			default:
				return fmt.Errorf("placement has an unknown member %q: want %s", k, placementForms)
			}
		}
		switch {
		case host != "" && spread:
			return fmt.Errorf("placement names host %q and asks to spread: choose one", host)
		case host != "":
			*p = Placement{Host: host}
		case len(o) == 0:
			return fmt.Errorf("placement {} names no host: want %s", placementForms)
		default:
			*p = Placement{Spread: spread}
		}
		return nil
	}
	return fmt.Errorf("placement %s is not one of %s", clip(b), placementForms)
}

// clip shortens a JSON value for an error message.
func clip(b []byte) string {
	const n = 40
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
