package hostagent

// Ancestor snapshots as the base of a pack (transfer.LineageBase) and of
// a download (storesync.Sync.LineageSeeds). A sandbox created from a
// snapshot S (a prepared environment: packages installed, a repository
// cloned) holds everything S added to its template; a pack of its capture
// diffed against the template carries all of that again, though the
// receiving host may hold S already (it created sandboxes from S too).
// So the receiving host says which durable snapshots it holds
// (HeldSnapshots, sent with its request for the pack), and when the
// capture's sandbox was created from one of them the sender diffs against
// that snapshot instead (PackHeader.BaseName "snapshots/<id>"): the pack
// carries what the sandbox changed since S, no more. Both hosts take the
// snapshot's chunk hashes from its manifest in the object store (the
// snapshot is durable there, its files the same bytes on every host that
// holds it), so neither hashes its files.
//
// A sandbox keeps its lineage (record.Lineage, SnapshotInfo.Lineage on
// its captures): fork children and children made on another host derive
// from what their parent did. And a download from the store of a set
// derived from a snapshot this host holds (a snapshot of such a sandbox,
// its pause) takes that snapshot's chunks from here
// (storesync.Sync.LineageSeeds).

// HeldSnapshots lists the durable snapshots whose files this host holds
// (newest first, at most storesync.MaxHeldSnapshots): the bases a pack
// sent to it may be diffed against (SendSnapshot's held). Nil without an
// object store.
func (a *Agent) HeldSnapshots() []string { return a.sync.HeldSnapshots() }

// lineageOf is the lineage of a sandbox restored from snapshot si: si
// itself if it is a user's (durable) snapshot, else (a transient
// capture) what si derives from.
func lineageOf(si SnapshotInfo) string {
	if si.Transient {
		return si.Lineage
	}
	return si.ID
}

// lineage is the durable snapshot the sandbox of r derives from: its
// Lineage, or for a record made before lineages were kept, the snapshot
// it was created from.
func (r record) lineage() string {
	if r.Lineage != "" {
		return r.Lineage
	}
	return r.Snapshot
}
