package network

// SetCreateStep sets a function run at each step of making a namespace,
// before the manager owns it (createStep; nil: none).
func SetCreateStep(f func(step, name string)) { createStep = f }
