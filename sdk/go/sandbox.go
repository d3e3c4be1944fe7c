package pandastack

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// SandboxState is the lifecycle state of a sandbox.
type SandboxState string

// Sandbox states.
const (
	StateStarting SandboxState = "starting"
	StateRunning  SandboxState = "running"
	StatePausing  SandboxState = "pausing"
	StatePaused   SandboxState = "paused"
	StateResuming SandboxState = "resuming"
	StateStopping SandboxState = "stopping"
	StateStopped  SandboxState = "stopped"
	// StateLost: the sandbox's host stopped heartbeating (a fleet); it is
	// back in the state it had when the host returns.
	StateLost SandboxState = "lost"
)

// SandboxInfo is the Sandbox object of the API.
type SandboxInfo struct {
	ID         string            `json:"id"`
	Template   string            `json:"template"`
	State      SandboxState      `json:"state"`
	MemoryMiB  int               `json:"memory_mib"`
	VCPUs      int               `json:"vcpus"`
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  time.Time         `json:"expires_at,omitzero"` // zero: no expiry (or stopped)
	TTLSeconds int               `json:"ttl_seconds,omitempty"`
	Metadata   map[string]string `json:"metadata"`
	HostID     string            `json:"host_id,omitempty"`
	// StopReason says why a stopped sandbox stopped: killed, expired,
	// vmm_exited, host_restarted.
	StopReason string `json:"stop_reason,omitempty"`
	// LastError is the message of the last operation that failed and left
	// the sandbox as it was, e.g. a resume that left it paused.
	LastError  string `json:"last_error,omitempty"`
	OnExpire   string `json:"on_expire,omitempty"` // kill or pause
	ParentID   string `json:"parent_id,omitempty"` // the sandbox it was forked from
	SnapshotID string `json:"snapshot_id,omitempty"`
	// Stored is a paused sandbox's saved state: local (its host's disk
	// only), uploading, or durable (in the object store: it can resume on
	// another host); StoreError why its last upload failed.
	Stored     string `json:"stored,omitempty"`
	StoreError string `json:"store_error,omitempty"`
	// Network is the sandbox's egress policy (nil from a server that
	// reports none).
	Network *Network `json:"network,omitempty"`
	// NetworkOff: the sandbox's host runs without sandbox networking
	// (--network off), so the guest reaches nothing whatever Network
	// says; the policy applies if it resumes on a host with networking.
	NetworkOff bool `json:"network_off,omitempty"`
	// Memory is the host memory of a running sandbox (nil otherwise).
	Memory *MemoryUsage `json:"memory,omitempty"`
	// Volumes are the volumes it mounts, in the order given at creation.
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// MemoryUsage is what a running sandbox costs the host, from its VMM's
// smaps: pages only it maps (what it dirtied, plus VMM overhead), pages
// it shares with other sandboxes (its template's or parent's memory
// image), and its proportional set size.
type MemoryUsage struct {
	PrivateMiB float64 `json:"private_mib"`
	SharedMiB  float64 `json:"shared_mib"`
	PSSMiB     float64 `json:"pss_mib"`
	// Lazy is set when the sandbox's memory image is paged in lazily
	// from the object store (a host restoring a snapshot or paused
	// sandbox it did not hold, with lazy restore on).
	Lazy *LazyMemory `json:"lazy,omitempty"`
}

// LazyMemory is what of a lazily paged memory image its host has read and
// fetched so far (shared by every sandbox of that host restored from the
// same snapshot or paused sandbox).
type LazyMemory struct {
	ImageMiB float64 `json:"image_mib"`
	// ReadMiB is what the host's kernel read of it (page faults, readahead).
	ReadMiB float64 `json:"read_mib"`
	// FetchedMiB is what came from the object store (whole chunks, by
	// faults or the background fetch); LocalMiB what came from the host's
	// copy of the template instead.
	FetchedMiB float64 `json:"fetched_mib"`
	LocalMiB   float64 `json:"local_mib"`
}

// Sandbox is a handle on one sandbox. Its methods are safe for concurrent
// use, except that Refresh, SetTTL, SetNetwork, Pause and Resume update
// Info, which callers must then not read concurrently.
type Sandbox struct {
	ID   string
	Info SandboxInfo // as of the last call that returned the sandbox

	c *Client
}

// CreateOptions describe a sandbox to create. Zero values leave the choice
// to the server (template base, TTL 300 s, 1024 MiB, 1 vCPU).
type CreateOptions struct {
	Template   string // "base", "tiny", a user template "NAME" (its latest version) or "NAME:3" (pinned)
	TTLSeconds int
	MemoryMiB  int
	VCPUs      int
	Metadata   map[string]string // free-form labels, filterable in List
	Env        map[string]string // default environment of every command
	// SnapshotID, if set, creates the sandbox from a snapshot instead of
	// a template (its template and shape come from the snapshot).
	SnapshotID string
	// OnExpire is what happens when the TTL runs out: "kill" (the
	// server's default when empty) or "pause" (see Sandbox.Pause); a
	// resume gives it its TTL again.
	OnExpire string
	// Network is the sandbox's egress policy; nil: the server's default,
	// the internet allowed. Note that a Network without Internet: true
	// denies everything but its AllowOut.
	Network *Network
	// Placement chooses the host (OnHost); zero: the server's choice.
	Placement Placement
	// Volumes are the volumes to mount (at most 8): each by name (or id)
	// at an absolute path that is not /, not under /proc, /sys or /dev,
	// and not inside another's. The sandbox runs on the volumes' host;
	// volumes on different hosts are ErrConflict. See docs/volumes.md.
	Volumes []VolumeMount
	// Progress, if not nil, receives a line for each step of what the
	// create does before the sandbox starts: fetching its template to
	// the host, baking it (a first create of a shape or of a user
	// template on a host can take tens of seconds). A server that does
	// not stream progress calls it never.
	Progress func(string)
}

// Create creates a sandbox and returns it running.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	if err := opts.Placement.check(); err != nil {
		return nil, err
	}
	pl, err := optionalPlacement(opts.Placement)
	if err != nil {
		return nil, err
	}
	req := wire.CreateSandboxRequest{
		Template: optional(opts.Template), TtlSeconds: optional(opts.TTLSeconds), MemoryMib: optional(opts.MemoryMiB),
		Vcpus: optional(opts.VCPUs), Metadata: optionalMap(opts.Metadata), Env: optionalMap(opts.Env),
		SnapshotId: optional(opts.SnapshotID), Network: wireNetwork(opts.Network),
		OnExpire: optional(wire.CreateSandboxRequestOnExpire(opts.OnExpire)), Placement: pl,
		Volumes: wireMounts(opts.Volumes),
	}
	var info SandboxInfo
	if opts.Progress == nil {
		if err := c.doJSON(ctx, http.MethodPost, path("sandboxes"), nil, req, &info); err != nil {
			return nil, err
		}
		return c.wrap(info), nil
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	hr, err := c.newRequest(ctx, http.MethodPost, path("sandboxes"), url.Values{"progress": {"1"}}, bytesReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") {
		// A server that does not stream a create's progress.
		if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
			return nil, fmt.Errorf("decode response: %w", err)
		}
		return c.wrap(info), nil
	}
	ev, err := readProgressStream(resp.Body, "create", "the sandbox was created", opts.Progress)
	if err != nil {
		return nil, err
	}
	if ev.Sandbox == nil {
		return nil, newError(0, CodeInternal, "create: done event without a sandbox")
	}
	return c.wrap(*ev.Sandbox), nil
}

// Sandbox returns a handle on the sandbox id without asking the server;
// its Info is empty until Refresh.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{ID: id, Info: SandboxInfo{ID: id}, c: c}
}

func (c *Client) wrap(info SandboxInfo) *Sandbox {
	return &Sandbox{ID: info.ID, Info: info, c: c}
}

// Get returns the sandbox id. Another key's sandbox is ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	if err := checkID("sandbox", id); err != nil {
		return nil, err
	}
	var info SandboxInfo
	if err := c.doJSON(ctx, http.MethodGet, path("sandboxes", id), nil, nil, &info); err != nil {
		return nil, err
	}
	return c.wrap(info), nil
}

// ListOptions filter List.
type ListOptions struct {
	// State keeps only sandboxes in this state; empty means every state
	// but stopped.
	State SandboxState
	// Metadata keeps only sandboxes whose metadata has all these pairs.
	Metadata map[string]string
}

// List returns this key's sandboxes, oldest first.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]*Sandbox, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", string(opts.State))
	}
	keys := make([]string, 0, len(opts.Metadata))
	for k := range opts.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("metadata", k+"="+opts.Metadata[k])
	}
	var out struct {
		Sandboxes []SandboxInfo `json:"sandboxes"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("sandboxes"), q, nil, &out); err != nil {
		return nil, err
	}
	sbs := make([]*Sandbox, len(out.Sandboxes))
	for i, info := range out.Sandboxes {
		sbs[i] = c.wrap(info)
	}
	return sbs, nil
}

// Refresh fetches the sandbox's current Info.
func (s *Sandbox) Refresh(ctx context.Context) error {
	return s.update(ctx, http.MethodGet, path("sandboxes", s.ID), nil)
}

// update sends a request whose answer is the sandbox and stores it in Info.
func (s *Sandbox) update(ctx context.Context, method, p string, in any) error {
	if err := checkID("sandbox", s.ID); err != nil {
		return err
	}
	var info SandboxInfo
	if err := s.c.doJSON(ctx, method, p, nil, in, &info); err != nil {
		return err
	}
	s.Info = info
	return nil
}

// SetTTL sets the sandbox to expire seconds from now and updates Info.
func (s *Sandbox) SetTTL(ctx context.Context, seconds int) error {
	return s.update(ctx, http.MethodPut, path("sandboxes", s.ID, "ttl"), wire.SetSandboxTTLJSONRequestBody{TtlSeconds: seconds})
}

// Kill kills the sandbox and frees everything it used.
func (s *Sandbox) Kill(ctx context.Context) error {
	if err := checkID("sandbox", s.ID); err != nil {
		return err
	}
	return s.c.doJSON(ctx, http.MethodDelete, path("sandboxes", s.ID), nil, nil, nil)
}

// Pause captures the running sandbox to the server's disk (the VM's memory
// and device state, next to its disk) and stops its VMM: a paused sandbox
// holds no host memory and does not expire; Resume restores the capture, so
// its processes carry on where they were. It updates Info. The pause runs on the server even if ctx
// ends first; Refresh then tells how it ended (State, LastError).
func (s *Sandbox) Pause(ctx context.Context) error {
	return s.update(ctx, http.MethodPost, path("sandboxes", s.ID, "pause"), nil)
}

// Resume restores a paused sandbox where it was and updates Info. The
// resume runs on the server even if ctx ends first; Refresh tells how it
// ended. If it fails the sandbox stays paused (LastError says why) and can
// be resumed again.
func (s *Sandbox) Resume(ctx context.Context) error {
	return s.update(ctx, http.MethodPost, path("sandboxes", s.ID, "resume"), nil)
}

// ResumeOn resumes a paused sandbox on the host pl names (a fleet's; it
// fetches the saved state from the object store the hosts share); the
// zero Placement is Resume.
func (s *Sandbox) ResumeOn(ctx context.Context, pl Placement) error {
	if err := pl.check(); err != nil {
		return err
	}
	w, err := wirePlacement(pl)
	if err != nil {
		return err
	}
	return s.update(ctx, http.MethodPost, path("sandboxes", s.ID, "resume"), wire.ResumeSandboxJSONRequestBody{Placement: w})
}

// Fork makes count copies of the running sandbox (memory, disk and
// processes). It returns the children that were made; if any could not be
// made, the error is a *ForkError listing why.
func (s *Sandbox) Fork(ctx context.Context, count int) ([]*Sandbox, error) {
	r, err := s.ForkWithStats(ctx, count)
	return r.Children, err
}

// ForkResult is a fork's children with the cost of the fork to the parent.
type ForkResult struct {
	Children []*Sandbox
	// ParentPausedMS is how long the parent's vCPUs were stopped.
	ParentPausedMS float64
	// DirtyBytes is the memory the parent had written since its restore,
	// which the fork captured.
	DirtyBytes int64
	// CrossHostCaptureBytes is the size of the parent's capture that went
	// to other hosts for children there (its own blocks); 0 when all are
	// on the parent's host.
	CrossHostCaptureBytes int64
	// CrossHostDirectBytes, CrossHostUploadedBytes and
	// CrossHostFetchedBytes are what really travelled for those children:
	// what the parent's host sent straight to the other hosts (the pages
	// that differ from their template), and, for hosts it could not send
	// to, what it sent to the object store (not its template's chunks)
	// and what those hosts read from it (not what their copy of the
	// template holds).
	CrossHostDirectBytes   int64
	CrossHostUploadedBytes int64
	CrossHostFetchedBytes  int64
	// CrossHostPulledBytes is the part of CrossHostDirectBytes that the
	// other hosts fetched from the parent's host themselves (the rest
	// the control plane relayed).
	CrossHostPulledBytes int64
}

// ForkWithStats is Fork that also reports what the fork cost the parent.
func (s *Sandbox) ForkWithStats(ctx context.Context, count int) (ForkResult, error) {
	if count < 1 {
		return ForkResult{}, newError(0, CodeInvalid, "fork count must be at least 1")
	}
	return s.ForkWithOptions(ctx, ForkOptions{Count: count})
}

// ForkOptions describe a fork.
type ForkOptions struct {
	Count int // children to make; 0 means 1
	// Placement chooses the children's hosts (OnHost, Spread); zero: the
	// parent's host while it has room. A parent that mounts volumes keeps
	// its children on its host.
	Placement Placement
	// VolumeMode is what the children mount of the parent's volumes:
	// VolumeShare (the default when empty) or VolumeBranch.
	VolumeMode string
}

// forkAnswer is the answer of POST /v1/sandboxes/{id}/fork.
type forkAnswer struct {
	Children []struct {
		Sandbox *SandboxInfo `json:"sandbox"`
		Error   *Error       `json:"error"`
	} `json:"children"`
	ParentPausedMS        float64 `json:"parent_paused_ms"`
	DirtyBytes            int64   `json:"dirty_bytes"`
	CrossHostCaptureBytes int64   `json:"cross_host_capture_bytes"`
	CrossHostDirect       int64   `json:"cross_host_direct_bytes"`
	CrossHostUploaded     int64   `json:"cross_host_uploaded_bytes"`
	CrossHostFetched      int64   `json:"cross_host_fetched_bytes"`
	CrossHostPulled       int64   `json:"cross_host_pulled_bytes"`
}

// ForkWithOptions is ForkWithStats with options: how many children, and
// on which hosts. If some children could not be made, the error is a
// *ForkError and the result holds the others.
func (s *Sandbox) ForkWithOptions(ctx context.Context, opts ForkOptions) (ForkResult, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return ForkResult{}, err
	}
	count := opts.Count
	if count == 0 {
		count = 1
	}
	if count < 1 {
		return ForkResult{}, newError(0, CodeInvalid, "fork count must be at least 1")
	}
	if err := opts.Placement.check(); err != nil {
		return ForkResult{}, err
	}
	pl, err := optionalPlacement(opts.Placement)
	if err != nil {
		return ForkResult{}, err
	}
	if m := opts.VolumeMode; m != "" && m != VolumeShare && m != VolumeBranch {
		return ForkResult{}, newError(0, CodeInvalid, `fork volume mode must be "share" or "branch", not `+strconv.Quote(m))
	}
	in := wire.ForkSandboxJSONRequestBody{Count: &count, Placement: pl, VolumeMode: optional(wire.ForkSandboxJSONBodyVolumeMode(opts.VolumeMode))}
	var out forkAnswer
	if err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "fork"), nil, in, &out); err != nil {
		return ForkResult{}, err
	}
	res := ForkResult{ParentPausedMS: out.ParentPausedMS, DirtyBytes: out.DirtyBytes, CrossHostCaptureBytes: out.CrossHostCaptureBytes,
		CrossHostDirectBytes: out.CrossHostDirect, CrossHostUploadedBytes: out.CrossHostUploaded, CrossHostFetchedBytes: out.CrossHostFetched, CrossHostPulledBytes: out.CrossHostPulled}
	ferr := &ForkError{Requested: count}
	for _, ch := range out.Children {
		switch {
		case ch.Sandbox != nil:
			res.Children = append(res.Children, s.c.wrap(*ch.Sandbox))
		case ch.Error != nil:
			ferr.Failures = append(ferr.Failures, newError(0, ch.Error.Code, ch.Error.Message))
		default:
			ferr.Failures = append(ferr.Failures, newError(0, CodeInternal, "the server answered a fork child with neither a sandbox nor an error"))
		}
	}
	if missing := count - len(out.Children); missing > 0 {
		for range missing {
			ferr.Failures = append(ferr.Failures, newError(0, CodeInternal, "the server answered fewer children than asked"))
		}
	}
	if len(ferr.Failures) > 0 {
		return res, ferr
	}
	return res, nil
}

// checkID rejects an empty id locally: it would address a different
// endpoint (the collection) instead of failing.
func checkID(what, id string) error {
	if id == "" {
		return newError(0, CodeInvalid, what+" id is empty")
	}
	return nil
}
