package hostwire

import "github.com/pandastack/pandastack/internal/contract/host"

// Volumes on the wire (host.Volumes and host.VolumeForker):
//
//   - POST /volumes (VolumeRequest) → host.VolumeInfo; GET /volumes →
//     {"volumes": [host.VolumeInfo]}; GET /volumes/{id}; PATCH
//     /volumes/{id} (VolumeRequest, its limit) → host.VolumeInfo; DELETE
//     /volumes/{id}?force=true|false.
//   - POST /volumes/{id}/branch (BranchRequest: the new volume) and POST
//     /volumes/{id}/promote (PromoteRequest: the volume it replaces) →
//     host.VolumeInfo.
//   - files, as a sandbox's: GET /volumes/{id}/files?path=P (one JSON line
//     of guestproto.FileInfo, then the bytes; an error after the first
//     byte in the X-Panda-Error trailer), PUT …/files?path=P&mode=M (the
//     body streamed in; WriteReply), DELETE …/files?path=P&recursive=B,
//     GET …/files/list?path=P ({"entries": [...]}), GET …/files/stat?path=P,
//     POST …/files/mkdir (PathRequest).
//   - POST /sandboxes/{id}/fork-volumes (ForkVolumesRequest) → ForkReply:
//     a fork whose children say what they mount. A route of its own: an
//     agent that does not know it answers 404, never a plain fork that
//     ignores the branches.

type (
	// VolumeRequest is the body of POST /volumes (ID and LimitBytes) and
	// of PATCH /volumes/{id} (LimitBytes).
	VolumeRequest struct {
		ID         string `json:"id,omitempty"`
		LimitBytes int64  `json:"limit_bytes"`
	}
	// BranchRequest is the body of POST /volumes/{id}/branch.
	BranchRequest struct {
		To string `json:"to"`
	}
	// PromoteRequest is the body of POST /volumes/{id}/promote.
	PromoteRequest struct {
		Target string `json:"target"`
	}
	// ForkVolumesRequest is the body of POST …/sandboxes/{id}/fork-volumes.
	ForkVolumesRequest struct {
		Children []ForkSpec `json:"children"`
	}
	// ForkSpec is host.ForkSpec on the wire. Volumes null: the parent's;
	// [] mounts none.
	ForkSpec struct {
		ID       string             `json:"id"`
		Volumes  []host.VolumeMount `json:"volumes"`
		Branches []VolumeBranch     `json:"branches,omitempty"`
	}
	// VolumeBranch is host.VolumeBranch on the wire.
	VolumeBranch struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
)

// ForkSpecsOf is children on the wire.
func ForkSpecsOf(children []host.ForkSpec) []ForkSpec {
	out := make([]ForkSpec, len(children))
	for i, c := range children {
		out[i] = ForkSpec{ID: c.ID, Volumes: c.Volumes}
		for _, b := range c.Branches {
			out[i].Branches = append(out[i].Branches, VolumeBranch{From: b.From, To: b.To})
		}
	}
	return out
}

// Contract is the children r asks for.
func (r ForkVolumesRequest) Contract() []host.ForkSpec {
	out := make([]host.ForkSpec, len(r.Children))
	for i, c := range r.Children {
		out[i] = host.ForkSpec{ID: c.ID, Volumes: c.Volumes}
		for _, b := range c.Branches {
			out[i].Branches = append(out[i].Branches, host.VolumeBranch{From: b.From, To: b.To})
		}
	}
	return out
}
