// Package memimage builds memory images for snapshots and forks without
// copying guest RAM. A running sandbox's RAM is its base image (a file)
// mapped MAP_PRIVATE: pages it never wrote are the file's, pages it wrote
// are private anonymous copies in the VMM process. DirtyPages finds those
// through /proc/PID/pagemap; Write makes a new image as a reflink clone of
// the base (O(metadata)) patched with just those pages, so a capture costs
// O(pages dirtied), not O(RAM size).
package memimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// PageSize is the host page size the pagemap is indexed by.
const PageSize = 4096

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // file-page or shared-anon
)

// Run is a range of dirty pages: byte offset into guest RAM (== offset in
// the image file) and length in bytes.
type Run struct {
	Off int64
	Len int64
}

// Region is a guest-RAM mapping in a process.
type Region struct {
	PID   int
	Start uint64 // virtual address of offset 0
	Size  uint64
}

// Map is what a scan of a guest-RAM mapping found.
type Map struct {
	// Dirty are the pages the process holds privately: present and
	// anonymous (written since the file was mapped), or swapped out (only
	// anonymous pages swap).
	Dirty      []Run
	DirtyBytes int64
	// ResidentBytes counts the pages present and still the file's: what
	// the guest read since its restore.
	ResidentBytes int64
}

// Scan reads r's page map. Adjacent pages are merged into runs. The
// process should be stopped (paused VMM) for the answer to be exact.
func Scan(r Region) (Map, error) {
	var m Map
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", r.PID))
	if err != nil {
		return m, fmt.Errorf("open pagemap: %w", err)
	}
	defer f.Close()
	pages := int64(r.Size / PageSize)
	const chunk = 64 << 10 // entries per read (512 KiB)
	buf := make([]byte, chunk*8)
	for first := int64(0); first < pages; first += chunk {
		n := min(chunk, pages-first)
		off := int64(r.Start/PageSize+uint64(first)) * 8
		if _, err := f.ReadAt(buf[:n*8], off); err != nil && !errors.Is(err, io.EOF) {
			return m, fmt.Errorf("read pagemap: %w", err)
		}
		for i := int64(0); i < n; i++ {
			e := binary.LittleEndian.Uint64(buf[i*8:])
			pageOff := (first + i) * PageSize
			switch {
			case (e&pmPresent != 0 && e&pmFile == 0) || e&pmSwapped != 0:
				m.Dirty = appendPage(m.Dirty, pageOff)
				m.DirtyBytes += PageSize
			case e&pmPresent != 0:
				m.ResidentBytes += PageSize
			}
		}
	}
	return m, nil
}

func appendPage(runs []Run, off int64) []Run {
	if k := len(runs) - 1; k >= 0 && runs[k].Off+runs[k].Len == off {
		runs[k].Len += PageSize
		return runs
	}
	return append(runs, Run{Off: off, Len: PageSize})
}

// Cloner makes dst a copy-on-write clone of src (volume.Clone).
type Cloner func(src, dst string) error

// Write creates dst as a clone of base patched with the runs of r, read
// from the process's memory. It returns the bytes copied. On error dst is
// removed.
func Write(dst, base string, clone Cloner, r Region, runs []Run) (int64, error) {
	if err := clone(base, dst); err != nil {
		return 0, fmt.Errorf("clone memory image: %w", err)
	}
	n, err := patch(dst, r, runs)
	if err != nil {
		os.Remove(dst)
		return 0, err
	}
	return n, nil
}

func patch(dst string, r Region, runs []Run) (int64, error) {
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", r.PID))
	if err != nil {
		return 0, fmt.Errorf("open process memory: %w", err)
	}
	defer mem.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("open memory image: %w", err)
	}
	buf := make([]byte, 1<<20)
	var total int64
	for _, run := range runs {
		for done := int64(0); done < run.Len; {
			n := min(int64(len(buf)), run.Len-done)
			if _, err := mem.ReadAt(buf[:n], int64(r.Start)+run.Off+done); err != nil {
				out.Close()
				return 0, fmt.Errorf("read guest memory at %#x: %w", run.Off+done, err)
			}
			if _, err := out.WriteAt(buf[:n], run.Off+done); err != nil {
				out.Close()
				return 0, fmt.Errorf("write memory image: %w", err)
			}
			done += n
			total += n
		}
	}
	if err := out.Close(); err != nil {
		return 0, fmt.Errorf("write memory image: %w", err)
	}
	return total, nil
}
