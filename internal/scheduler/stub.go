// Package scheduler (stub until the real one lands).
package scheduler

import (
	"encoding/json"
	"errors"
)

type HostState string

const (
	Ready    HostState = "ready"
	Draining HostState = "draining"
	Lost     HostState = "lost"
)

type Host struct {
	ID            string
	State         HostState
	CPUs          int
	MemoryMiB     int64
	FreeMemoryMiB int64
	DiskFreeMiB   int64
	Sandboxes     int
	VCPUs         int
	WarmTemplates []string
}

type Placement struct {
	Host   string
	Spread bool
}

type Request struct {
	Template   string
	MemoryMiB  int
	VCPUs      int
	Count      int
	ParentHost string
	Placement  Placement
}

type Choice struct {
	Host   string
	Reason string
}

var (
	ErrUnknownHost  = errors.New("unknown host")
	ErrHostNotReady = errors.New("host not ready")
	ErrNoCapacity   = errors.New("no host has room")
)

func Place(req Request, hosts []Host) ([]Choice, error) {
	n := max(req.Count, 1)
	want := req.Placement.Host
	if want == "" {
		want = req.ParentHost
	}
	if want != "" {
		for _, h := range hosts {
			if h.ID == want && h.State == Ready {
				out := make([]Choice, n)
				for i := range out {
					out[i] = Choice{Host: h.ID, Reason: "stub"}
				}
				return out, nil
			}
			if h.ID == want && req.Placement.Host != "" {
				return nil, ErrHostNotReady
			}
		}
		if req.Placement.Host != "" {
			return nil, ErrUnknownHost
		}
	}
	for _, h := range hosts {
		if h.State == Ready {
			out := make([]Choice, n)
			for i := range out {
				out[i] = Choice{Host: h.ID, Reason: "stub"}
			}
			return out, nil
		}
	}
	return nil, ErrNoCapacity
}

func (p *Placement) UnmarshalJSON(b []byte) error {
	s := string(b)
	switch s {
	case "null", `"auto"`:
		*p = Placement{}
		return nil
	case `"spread"`:
		*p = Placement{Spread: true}
		return nil
	}
	var v struct {
		Host   string `json:"host"`
		Spread bool   `json:"spread"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return errors.New(`placement must be "spread" or {"host": "ID"}`)
	}
	*p = Placement{Host: v.Host, Spread: v.Spread}
	return nil
}
