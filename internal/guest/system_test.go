package guest

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestQuietKnobs holds quietKnobs to their form: absolute, clean paths
// under /proc/sys or /sys, each once, each with a whole number to write
// (TestCreateExec in internal/hostagent reads them back in a real guest).
func TestQuietKnobs(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range quietKnobs {
		if k.path != filepath.Clean(k.path) || !(strings.HasPrefix(k.path, "/proc/sys/") || strings.HasPrefix(k.path, "/sys/")) {
			t.Errorf("path %q: want a clean path under /proc/sys/ or /sys/", k.path)
		}
		if seen[k.path] {
			t.Errorf("path %q listed twice", k.path)
		}
		seen[k.path] = true
		if _, err := strconv.ParseUint(k.value, 10, 64); err != nil {
			t.Errorf("%s: value %q is not a whole number", k.path, k.value)
		}
	}
	for _, want := range []string{"/proc/sys/kernel/watchdog", "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs"} {
		if !seen[want] {
			t.Errorf("quietKnobs lacks %s", want)
		}
	}
}
