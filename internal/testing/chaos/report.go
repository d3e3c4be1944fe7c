package chaos

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is what a run did and found.
type Report struct {
	Seed       int64  `json:"seed"`
	Mode       string `json:"mode"` // up or split, "+network" with networking
	DataDir    string `json:"data_dir"`
	Iterations int    `json:"iterations"`
	// DurationSeconds is the run's wall-clock time.
	DurationSeconds float64 `json:"duration_seconds"`
	// Ops counts operations by kind and outcome: ok, failed (a fault
	// excused it), unexpected (also counted as failed: nothing excused
	// it, a violation).
	Ops map[string]map[string]int `json:"ops"`
	// Faults counts the faults injected, by kind; FailpointsHit the
	// failpoints that crashed a process, by name.
	Faults        map[string]int `json:"faults"`
	FailpointsHit map[string]int `json:"failpoints_hit"`
	// Restarts counts the processes started again, by role.
	Restarts map[string]int `json:"restarts"`
	// Checks counts the invariant checks that passed; ContentChecks the
	// sandboxes whose files and processes were probed.
	Checks        int `json:"checks"`
	ContentChecks int `json:"content_checks"`
	// VolumeChecks counts the checks of a volume's acknowledged writes.
	VolumeChecks int `json:"volume_checks"`
	// Violations are the invariants that did not hold (only the first,
	// unless the run kept going).
	Violations []string `json:"violations,omitempty"`
	// Soak is the resource samples of a soak run.
	Soak *SoakReport `json:"soak,omitempty"`
	// Logs is the end of the deployment's output when the run failed.
	Logs string `json:"logs,omitempty"`
}

func newReport(cfg Config) *Report {
	mode := "up"
	if cfg.Split {
		mode = "split"
	}
	if cfg.Network {
		mode += "+network"
	}
	return &Report{Seed: cfg.Seed, Mode: mode, Ops: map[string]map[string]int{}, Faults: map[string]int{},
		FailpointsHit: map[string]int{}, Restarts: map[string]int{}}
}

func (r *Report) op(kind, outcome string) {
	if r.Ops[kind] == nil {
		r.Ops[kind] = map[string]int{}
	}
	r.Ops[kind][outcome]++
}

func (r *Report) setDuration(d time.Duration) { r.DurationSeconds = d.Seconds() }

// Duration is the run's wall-clock time.
func (r Report) Duration() time.Duration {
	return time.Duration(r.DurationSeconds * float64(time.Second))
}

// WriteText writes the report as a summary for people.
func (r Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "chaos: %d iterations in %s mode, seed %d, %v\n", r.Iterations, r.Mode, r.Seed, r.Duration().Round(time.Second))
	total := 0
	var lines []string
	for _, kind := range slices.Sorted(maps.Keys(r.Ops)) {
		o := r.Ops[kind]
		n := o["ok"] + o["failed"]
		total += n
		l := fmt.Sprintf("  %-22s %5d  ok %d, failed %d", kind, n, o["ok"], o["failed"])
		if o["unexpected"] > 0 {
			l += fmt.Sprintf(" (%d unexpected)", o["unexpected"])
		}
		lines = append(lines, l)
	}
	fmt.Fprintf(w, "operations: %d\n%s\n", total, strings.Join(lines, "\n"))
	fmt.Fprintf(w, "faults: %s\n", counts(r.Faults))
	fmt.Fprintf(w, "failpoints hit: %s\n", counts(r.FailpointsHit))
	fmt.Fprintf(w, "restarts: %s\n", counts(r.Restarts))
	fmt.Fprintf(w, "checks passed: %d; sandboxes probed: %d; volume checks: %d\n", r.Checks, r.ContentChecks, r.VolumeChecks)
	if r.Soak != nil {
		r.Soak.writeText(w)
	}
	if len(r.Violations) == 0 {
		fmt.Fprintln(w, "violations: none")
		return
	}
	fmt.Fprintf(w, "violations: %d\n", len(r.Violations))
	for _, v := range r.Violations {
		fmt.Fprintf(w, "  %s\n", v)
	}
	fmt.Fprintf(w, "replay: panda chaos --seed %d", r.Seed)
	if strings.HasPrefix(r.Mode, "split") {
		fmt.Fprint(w, " --split")
	}
	fmt.Fprintln(w)
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	total := 0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		total += m[k]
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}
