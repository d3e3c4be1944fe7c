// Package tiers_test holds the tree's dependency rule (docs/architecture.md,
// "Tiers"): which tier of internal/ may reach which, transitively, outside
// tests. The compiler keeps each tier's internal/ directories to that tier;
// this test keeps the tiers apart.
package tiers_test

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/pandastack/pandastack/"

// tierOf names the tier of a package of the module ("" for one outside
// internal/: cmd/, api/, sdk/, scripts/, which may reach anything).
func tierOf(pkg string) string {
	rel, ok := strings.CutPrefix(pkg, module+"internal/")
	if !ok {
		return ""
	}
	tier, _, _ := strings.Cut(rel, "/")
	return tier
}

// mayNotReach is the rule: what each tier must not depend on, directly or
// not, and why. The contract reaches nothing but the standard library
// (checked apart); testing and the packages outside internal/ may reach
// anything.
var mayNotReach = map[string]map[string]string{
	"controlplane": {
		"hostagent": "the control plane drives hosts through the contract only (internal/contract/host), over the host RPC's client",
		"guest":     "the control plane reaches guests through a host",
		"testing":   "test kits are for tests",
	},
	"hostagent": {
		"controlplane": "a host agent serves a control plane; it does not contain one",
		"guest":        "the host talks to its guests over the guest protocol (internal/contract/guestproto)",
		"testing":      "test kits are for tests",
	},
	"guest": {
		"controlplane": "the guest agent runs inside the sandbox, alone",
		"hostagent":    "the guest agent runs inside the sandbox, alone",
		"storage":      "the guest agent runs inside the sandbox, alone",
		"testing":      "test kits are for tests",
	},
	"storage": {
		"controlplane": "storage serves the tiers above it",
		"hostagent":    "storage serves the tiers above it",
		"guest":        "storage serves the tiers above it",
		"testing":      "test kits are for tests",
	},
	"contract": {}, // stdlib only: see below
}

// TestTiers: every package of internal/ keeps to its tier's rule, with
// what it reaches transitively (go list -deps), tests excluded.
func TestTiers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Deps}} {{.}}{{end}}", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	tiers := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, deps := f[0], f[1:]
		tier := tierOf(pkg)
		if tier == "" {
			continue
		}
		rule, ok := mayNotReach[tier]
		if !ok && tier != "testing" {
			t.Errorf("%s is in internal/%s, which is no tier: put it in one (docs/architecture.md)", pkg, tier)
			continue
		}
		tiers[tier]++
		var bad []string
		for _, d := range deps {
			if tier == "contract" {
				if first, _, _ := strings.Cut(d, "/"); strings.Contains(first, ".") && tierOf(d) != "contract" {
					bad = append(bad, d+" (the contract imports the standard library and itself only)")
				}
				continue
			}
			if why, no := rule[tierOf(d)]; no {
				bad = append(bad, d+" ("+why+")")
			}
		}
		sort.Strings(bad)
		for _, b := range bad {
			t.Errorf("%s reaches %s", strings.TrimPrefix(pkg, module), strings.TrimPrefix(b, module))
		}
	}
	for _, tier := range []string{"contract", "controlplane", "hostagent", "guest", "storage", "testing"} {
		if tiers[tier] == 0 {
			t.Errorf("no package in internal/%s: the rule checks nothing there", tier)
		}
	}
}
