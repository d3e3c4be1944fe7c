package testkit

import (
	"bufio"
	"io"
	"os"
	"slices"
	"strings"
)

// mountInfoEscapes undoes the octal escapes of /proc/PID/mountinfo.
var mountInfoEscapes = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)

// MountPoints lists the mount points of this process's mount namespace
// (/proc/self/mountinfo), in the table's order; nil if it cannot be read.
func MountPoints() []string {
	return MountPointsOf("self")
}

// MountPointsOf is MountPoints of process pid ("self" or a number).
func MountPointsOf(pid string) []string {
	f, err := os.Open("/proc/" + pid + "/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	return parseMountPoints(f)
}

// parseMountPoints reads the mount points (the fifth field) of a
// mountinfo table.
func parseMountPoints(r io.Reader) []string {
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			out = append(out, mountInfoEscapes.Replace(fields[4]))
		}
	}
	return out
}

// Mounted reports whether path is a mount point of this process's mount
// namespace.
func Mounted(path string) bool {
	return slices.Contains(MountPoints(), path)
}

// MountsAt counts the mounts stacked at path.
func MountsAt(path string) int {
	n := 0
	for _, mp := range MountPoints() {
		if mp == path {
			n++
		}
	}
	return n
}

// MountsUnder lists the mount points strictly under dir, deepest first
// (the order to unmount them in).
func MountsUnder(dir string) []string {
	var out []string
	for _, mp := range MountPoints() {
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}
