package chunkstore

import (
	"os"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Extent maps, to skip reading what a file shares with its base. On a
// copy-on-write file system a capture is a reflink of its template with
// the pages the sandbox wrote replaced: where the capture's range maps to
// the very disk blocks the template's same range maps to, the two hold the
// same bytes, so the chunk's hash is the template's (from its index) and
// the chunk need not be read and hashed. FIEMAP tells which blocks a range
// maps to, once the file is flushed (FIEMAP_FLAG_SYNC); anything it
// cannot say for sure (delayed allocation, inline or
// encoded data, an error, no support) makes the chunk be read as usual.

// extent is one mapped range of a file.
type extent struct {
	logical, physical, length int64
}

// extentMap is a file's extents in logical order; nil if unknown.
type extentMap []extent

const (
	fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)

	fiemapFlagSync   = 0x1 // flush the file before mapping it
	fiemapExtentLast = 0x1
	// Flags under which the physical address does not identify the data.
	fiemapExtentUncertain = 0x2 | 0x4 | 0x8 | 0x80 | 0x100 | 0x200 | 0x400 // unknown, delalloc, encoded, encrypted, not aligned, inline, tail
)

type fiemapHeader struct {
	start, length                   uint64
	flags, mapped, count, reserved0 uint32
}

type fiemapExtent struct {
	logical, physical, length uint64
	reserved64                [2]uint64
	flags                     uint32
	reserved                  [3]uint32
}

// extentsOf reads f's extent map; nil if it cannot be known (or has an
// extent whose blocks do not identify its data).
func extentsOf(f *os.File) extentMap {
	const batch = 512
	buf := make([]byte, int(unsafe.Sizeof(fiemapHeader{}))+batch*int(unsafe.Sizeof(fiemapExtent{})))
	hdr := (*fiemapHeader)(unsafe.Pointer(&buf[0]))
	exts := unsafe.Slice((*fiemapExtent)(unsafe.Pointer(&buf[unsafe.Sizeof(fiemapHeader{})])), batch)
	var out extentMap
	start := uint64(0)
	for {
		// Synced: a write not yet written back into a range shared with
		// another file (a reflink) is not in the map until it is (on XFS
		// it waits in the copy-on-write fork, and the range still maps to
		// the shared blocks), so without the flush a chunk could pass for
		// its base's with other bytes. The caller may not have flushed
		// (a transient capture is not).
		*hdr = fiemapHeader{start: start, length: ^uint64(0) - start, count: batch, flags: fiemapFlagSync}
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); errno != 0 {
			return nil
		}
		if hdr.mapped == 0 {
			return out
		}
		for _, e := range exts[:hdr.mapped] {
			if e.flags&fiemapExtentUncertain != 0 {
				return nil
			}
			out = append(out, extent{logical: int64(e.logical), physical: int64(e.physical), length: int64(e.length)})
			if e.flags&fiemapExtentLast != 0 {
				return out
			}
		}
		last := exts[hdr.mapped-1]
		start = last.logical + last.length
	}
}

// sameBlocks reports whether [off, off+n) of the files whose maps are a and
// b is mapped to the same disk blocks, all of it.
func sameBlocks(a, b extentMap, off, n int64) bool {
	if a == nil || b == nil {
		return false
	}
	ra, rb := a.clip(off, n), b.clip(off, n)
	if len(ra) == 0 || len(ra) != len(rb) {
		return false
	}
	covered := int64(0)
	for i := range ra {
		if ra[i] != rb[i] {
			return false
		}
		covered += ra[i].length
	}
	return covered == n
}

// clip returns the parts of m's extents inside [off, off+n), with
// physically contiguous neighbours merged (two files can split one run of
// blocks differently).
func (m extentMap) clip(off, n int64) []extent {
	i := sort.Search(len(m), func(i int) bool { return m[i].logical+m[i].length > off })
	var out []extent
	for ; i < len(m) && m[i].logical < off+n; i++ {
		e := m[i]
		s, end := max(e.logical, off), min(e.logical+e.length, off+n)
		p := e.physical + (s - e.logical)
		if k := len(out) - 1; k >= 0 && out[k].logical+out[k].length == s && out[k].physical+out[k].length == p {
			out[k].length += end - s
			continue
		}
		out = append(out, extent{logical: s, physical: p, length: end - s})
	}
	return out
}

// sharedRuns returns the parts of [off, off+n), in order, that the files
// whose maps are a and b map to the same disk blocks: there they hold the
// same bytes, and a reader that has b's need not read a's.
func sharedRuns(a, b extentMap, off, n int64) []extent {
	if a == nil || b == nil {
		return nil
	}
	ra, rb := a.clip(off, n), b.clip(off, n)
	var out []extent
	for i, j := 0, 0; i < len(ra) && j < len(rb); {
		x, y := ra[i], rb[j]
		s, e := max(x.logical, y.logical), min(x.logical+x.length, y.logical+y.length)
		if s < e && x.physical+(s-x.logical) == y.physical+(s-y.logical) {
			if k := len(out) - 1; k >= 0 && out[k].logical+out[k].length == s {
				out[k].length += e - s
			} else {
				out = append(out, extent{logical: s, length: e - s})
			}
		}
		if x.logical+x.length <= y.logical+y.length {
			i++
		} else {
			j++
		}
	}
	return out
}
