package hostagent

import (
	"context"
	"fmt"
	"io"

	"github.com/pandastack/pandastack/internal/hostagent/internal/transfer"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
)

// Direct transfers (package transfer): a snapshot (in practice a
// cross-host fork's transient capture) sent from this host straight to
// another as a pack, without the object store. A transient capture is
// uploaded only once someone waits for it to be durable (AwaitStored),
// which a fork that went direct never does.

// SendSnapshot writes snapshot id, held on this host, to w as a pack
// diffed against this host's copy of its template (whole chunks if it has
// none) — or, if the receiver holds (held: its HeldSnapshots) the
// snapshot the capture's sandbox was created from, against that
// (lineage.go). ErrNotFound if the host does not hold the snapshot's
// files.
func (a *Agent) SendSnapshot(ctx context.Context, id string, held []string, w io.Writer) (chunkstore.PackStats, error) {
	si, err := a.GetSnapshot(id)
	if err != nil {
		return chunkstore.PackStats{}, err
	}
	return a.transfers.Send(ctx, si, a.snapshotDir(id), held, w)
}

// ReceiveSnapshot reads a pack of snapshot id (SendSnapshot's, from
// another host) from r and keeps it as this host's snapshot id, complete
// or not at all; a create from it then restores as from any snapshot. Its
// FetchedBytes is the length of the pack. Errors are transfer.Receive's:
// ErrConflict if the host has a snapshot id already; templates.ErrNotFound
// if the host lacks the sender's copy of the pack's base, before anything
// is written (the caller sends it another way); ErrCorrupt if the stream
// is cut short or damaged; ErrInvalid if it is not snapshot id's.
func (a *Agent) ReceiveSnapshot(ctx context.Context, id string, r io.Reader) (SnapshotInfo, error) {
	return a.receiveSnapshot(ctx, id, r, nil)
}

// receiveSnapshot is ReceiveSnapshot telling arr (if not nil) what
// arrives as it does (transfer.Arrival). A snapshot received that is not
// transient is this host's own from then on: it is uploaded as one.
func (a *Agent) receiveSnapshot(ctx context.Context, id string, r io.Reader, arr *transfer.Arrival) (SnapshotInfo, error) {
	si, st, err := a.transfers.Receive(ctx, id, r, arr)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if !si.Transient {
		a.sync.StartUpload(id) // a snapshot of this host's now: durable as its own
	}
	out, err := a.GetSnapshot(id)
	out.FetchedBytes = st.Bytes
	return out, err
}

// ReceiveAndCreate receives a pack of snapshot req.SnapshotID from r, as
// ReceiveSnapshot, and creates sandbox req from it, as Create, starting
// the sandbox's VMM while the pack still arrives: its files are linked
// once the disk is in (the pack's files come in name order: the disk,
// then the memory image and the device state), and the machine is loaded
// once all of it is, its records checked. The VMM's start, about a
// hundred milliseconds under TCG, so overlaps the memory's transfer;
// nothing of the guest runs before its memory is complete.
//
// It returns the sandbox and the snapshot kept. A pack that is not
// received (ReceiveSnapshot's errors) returns that error and a zero
// SnapshotInfo, and no sandbox remains; one that is received keeps the
// snapshot (its SnapshotInfo) whether the create succeeds or fails (its
// error: Create's).
func (a *Agent) ReceiveAndCreate(ctx context.Context, req CreateRequest, r io.Reader) (Info, SnapshotInfo, error) {
	if req.SnapshotID == "" {
		return Info{}, SnapshotInfo{}, fmt.Errorf("create sandbox: %w: a snapshot id is required", ErrInvalid)
	}
	if err := checkCreate(&req); err != nil {
		return Info{}, SnapshotInfo{}, err
	}
	arr := transfer.NewArrival()
	type received struct {
		si  SnapshotInfo
		err error
	}
	recv := make(chan received, 1)
	go func() {
		si, err := a.receiveSnapshot(ctx, req.SnapshotID, r, arr)
		recv <- received{si, err}
	}()
	select {
	case <-arr.Begun():
	case rv := <-recv: // refused before its files were made
		return Info{}, SnapshotInfo{}, rv.err
	}
	info, cerr := a.createFrom(ctx, req, image{Spec: arr.Info().Spec, Template: arr.Info().Template, lineage: lineageOf(arr.Info()), arrival: arr}, chunkstore.DownloadStats{})
	rv := <-recv
	if rv.err != nil {
		return Info{}, SnapshotInfo{}, rv.err // the create, waiting for it, failed too
	}
	return info, rv.si, cerr
}
