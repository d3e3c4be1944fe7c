package hostwire

import (
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// CreateRequest is host.CreateRequest on the wire: the body of POST
// /sandboxes, the first line of …/pack/create (without SnapshotID: the
// path's) and PullRequest's Create.
type CreateRequest struct {
	ID         string             `json:"id"`
	Template   string             `json:"template,omitempty"`
	MemoryMiB  int                `json:"memory_mib,omitempty"`
	VCPUs      int                `json:"vcpus,omitempty"`
	Env        map[string]string  `json:"env,omitempty"`
	SnapshotID string             `json:"snapshot_id,omitempty"`
	Owner      string             `json:"owner,omitempty"`
	Network    netpolicy.Policy   `json:"network"`
	Volumes    []host.VolumeMount `json:"volumes,omitempty"`
}

// CreateRequestOf is req on the wire (without its Progress, which the
// client asks for with ?progress=1).
func CreateRequestOf(req host.CreateRequest) CreateRequest {
	return CreateRequest{ID: req.ID, Template: req.Template, MemoryMiB: req.MemoryMiB, VCPUs: req.VCPUs, Env: req.Env,
		SnapshotID: req.SnapshotID, Owner: req.Owner, Network: req.Network, Volumes: req.Volumes}
}

// Contract is the create request r carries.
func (r CreateRequest) Contract() host.CreateRequest {
	return host.CreateRequest{ID: r.ID, Template: r.Template, MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, Env: r.Env,
		SnapshotID: r.SnapshotID, Owner: r.Owner, Network: r.Network, Volumes: r.Volumes}
}

// Requests and replies.
type (
	// PullRequest is the body of POST …/snapshots/{id}/pack/pull.
	PullRequest struct {
		Create CreateRequest   `json:"create"`
		From   host.PackSource `json:"from"`
	}
	// PackCreateResponse answers POST …/snapshots/{id}/pack/create and
	// …/pack/pull.
	PackCreateResponse struct {
		Sandbox  host.Info         `json:"sandbox"`
		Snapshot host.SnapshotInfo `json:"snapshot"`
	}
	// ForkRequest is the body of POST …/sandboxes/{id}/fork: the
	// children's ids.
	ForkRequest struct {
		IDs []string `json:"ids"`
	}
	// ForkChild is one child in a ForkReply: its Info, or its error.
	ForkChild struct {
		Info  host.Info `json:"info"`
		Error *Error    `json:"error,omitempty"`
	}
	// ForkReply answers a fork (host.ForkResult).
	ForkReply struct {
		Children []ForkChild       `json:"children"`
		Capture  host.CaptureStats `json:"capture"`
	}
	// SnapshotRequest is the body of POST …/sandboxes/{id}/snapshot.
	SnapshotRequest struct {
		SnapshotID string `json:"snapshot_id"`
	}
	// LookupReply answers POST /templates/lookup.
	LookupReply struct {
		Template    *templates.Meta `json:"template"`
		StaleReason string          `json:"stale_reason,omitempty"`
	}
	// ProgressEvent is a line of a bake's stream, and of a create's that
	// asked for its progress (?progress=1): done carries the template of
	// a bake, the sandbox's Info of a create.
	ProgressEvent struct {
		Type     string          `json:"type"` // ProgressLine, ProgressDone or ProgressError
		Message  string          `json:"message,omitempty"`
		Template *templates.Meta `json:"template,omitempty"`
		Info     *host.Info      `json:"info,omitempty"`
		Error    *Error          `json:"error,omitempty"`
	}
	// PathRequest is the body of POST …/files/mkdir.
	PathRequest struct {
		Path string `json:"path"`
	}
	// RenameRequest is the body of POST …/files/rename.
	RenameRequest struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	// WriteReply answers PUT …/files.
	WriteReply struct {
		Written int64 `json:"written"`
	}
	// StartFrame is the payload of an exec's first frame (FrameStart).
	StartFrame struct {
		PID int `json:"pid"`
	}
)

// Types of a ProgressEvent.
const (
	ProgressLine  = "progress"
	ProgressDone  = "done"
	ProgressError = "error"
)
