package qemu

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// noHugePages turns transparent huge pages off for the calling process and
// so for every VMM it starts: the flag (PR_SET_THP_DISABLE) belongs to the
// process and is inherited across fork and kept across execve, and it
// overrides madvise(MADV_HUGEPAGE).
//
// Why: QEMU asks for huge pages on its own anonymous memory — under TCG the
// translation cache, which an idle guest fills only in part — so with THP
// at "madvise" or "always" each VMM's private memory is rounded up in 2 MiB
// steps. Guest RAM is not concerned: it is a file mapping (the memory file,
// shared or private), which anonymous THP never backs, on KVM as on TCG.
// Measured with panda bench density: see docs/benchmarks.md.
//
// The calling process (the host agent) loses huge pages for its own heap
// too, which costs it nothing measurable.
func noHugePages() error {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("turn transparent huge pages off for vmms: %w", err)
	}
	return nil
}
