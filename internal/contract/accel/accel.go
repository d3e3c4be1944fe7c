// Package accel names the CPU virtualization back ends a host runs guests
// with. Hosts report theirs; the control plane shows it and keeps
// snapshots and templates to hosts of the same one. Standard library only.
package accel

// Accel is a CPU virtualization back end.
type Accel string

const (
	Auto Accel = "auto" // probe KVM by booting a canary guest, else TCG
	KVM  Accel = "kvm"
	TCG  Accel = "tcg"
)
