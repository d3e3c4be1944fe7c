package hostwire

import "github.com/pandastack/pandastack/internal/contract/guestproto"

// MaxStdinBody bounds the body of one POST …/processes/{pid}/stdin; the
// client sends larger writes in several.
const MaxStdinBody = 1 << 20

// Wire types of background processes and directory watches.
type (
	// AttachFrame is the payload of an attach's first frame (FrameAttach).
	AttachFrame struct {
		Start guestproto.AttachStart `json:"start"`
		Proc  guestproto.ProcInfo    `json:"proc"`
	}
	// AttachEndFrame is the payload of an attach's last frame
	// (FrameAttachEnd).
	AttachEndFrame struct {
		Proc   guestproto.ProcInfo `json:"proc"`
		Lagged bool                `json:"lagged,omitempty"`
	}
	// SignalRequest is the body of POST …/processes/{pid}/signal.
	SignalRequest struct {
		Signal string `json:"signal"`
	}
	// ResizeRequest is the body of POST …/processes/{pid}/resize.
	ResizeRequest struct {
		Rows int `json:"rows"`
		Cols int `json:"cols"`
	}
	// WatchLine is a line of GET …/watch: a guestproto.WatchEvent, or,
	// last, {"type":"end"} (WatchEnd: the guest ended the watch, io.EOF)
	// or {"type":"error","error":{…}} (WatchError).
	WatchLine struct {
		guestproto.WatchEvent
		Error *Error `json:"error,omitempty"`
	}
)

// Types of a WatchLine that ends the watch.
const (
	WatchEnd   = "end"
	WatchError = "error"
)
