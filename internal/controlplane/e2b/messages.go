package e2b

import (
	"encoding/json"
	"errors"
)

// The messages of envd's process.Process and filesystem.Filesystem
// services (package process and package filesystem of e2b-dev/infra's
// packages/envd/spec, Apache-2.0, © FoundryLabs, Inc.) as the proto3 JSON
// mapping writes them: lowerCamelCase names, bytes as base64, int64 as a
// string, enums by name, Timestamps as RFC 3339. They are written by hand
// from the services' descriptors rather than generated (this repository
// has no protoc), and only the fields PandaStack serves are here: JSON
// readers on both sides ignore unknown fields. The SDK speaks the JSON
// codec only (useBinaryFormat: false), so jsonCodec replaces connect's.

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	PTY     *ptyConfig    `json:"pty,omitempty"`
	Tag     *string       `json:"tag,omitempty"`
	Stdin   *bool         `json:"stdin,omitempty"`
}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"` // a PTY process's output (all of it)
}

// ptyConfig is process.PTY: a terminal's size.
type ptyConfig struct {
	Size ptySize `json:"size"`
}

type ptySize struct {
	Cols uint32 `json:"cols"`
	Rows uint32 `json:"rows"`
}

// updateRequest is process.UpdateRequest: a PTY's new size.
type updateRequest struct {
	Process processSelector `json:"process"`
	PTY     *ptyConfig      `json:"pty,omitempty"`
}

type watchDirRequest struct {
	Path         string `json:"path"`
	Recursive    bool   `json:"recursive"`
	IncludeEntry bool   `json:"includeEntry"`
}

// Event types of filesystem.FilesystemEvent.
const (
	eventCreate = "EVENT_TYPE_CREATE"
	eventWrite  = "EVENT_TYPE_WRITE"
	eventRemove = "EVENT_TYPE_REMOVE"
	eventRename = "EVENT_TYPE_RENAME"
	eventChmod  = "EVENT_TYPE_CHMOD"
)

// filesystemEvent's Name is the path relative to the watched directory.
type filesystemEvent struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// watchDirResponse is one of its oneof: start, filesystem or keepalive.
type watchDirResponse struct {
	Start      *struct{}        `json:"start,omitempty"`
	Filesystem *filesystemEvent `json:"filesystem,omitempty"`
	Keepalive  *struct{}        `json:"keepalive,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

type startResponse struct {
	Event processEvent `json:"event"`
}

// File types of filesystem.EntryInfo.
const (
	fileTypeFile      = "FILE_TYPE_FILE"
	fileTypeDirectory = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink   = "FILE_TYPE_SYMLINK"
)

type entryInfo struct {
	Name          string            `json:"name"`
	Type          string            `json:"type"`
	Path          string            `json:"path"`
	Size          int64             `json:"size,string"`
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  string            `json:"modifiedTime,omitempty"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string `json:"path"`
	Depth uint32 `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

type empty struct{}

// jsonCodec is connect's "json" codec for the hand-written messages above
// (connect's own needs generated proto.Message types).
type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }

func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (jsonCodec) Unmarshal(b []byte, v any) error {
	if len(b) == 0 {
		return nil // proto3 JSON: an empty body is the empty message
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errors.New("invalid JSON message: " + err.Error())
	}
	return nil
}

// processSelector is ProcessSelector: a pid or a tag given at Start.
type processSelector struct {
	PID *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type connectRequest struct {
	Process processSelector `json:"process"`
}

type connectResponse struct {
	Event processEvent `json:"event"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	PTY   []byte `json:"pty,omitempty"`
}

type sendInputRequest struct {
	Process processSelector `json:"process"`
	Input   processInput    `json:"input"`
}

// sendSignalRequest's Signal is the enum's name ("SIGNAL_SIGKILL") or,
// from a lenient writer, its number.
type sendSignalRequest struct {
	Process processSelector `json:"process"`
	Signal  json.RawMessage `json:"signal"`
}

type closeStdinRequest struct {
	Process processSelector `json:"process"`
}
