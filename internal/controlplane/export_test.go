package controlplane

// SettleTails waits for the tails of operations that run after their
// answer (Plane.background): a cross-host fork's deletes of its capture.
func SettleTails(p *Plane) { p.tailsWG.Wait() }

// The pure rules of volumes, for their table tests.
var (
	BranchName      = branchName
	CheckMountPaths = checkMountPaths
)
