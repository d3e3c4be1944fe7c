package guest

// ring keeps the last max bytes of a stream and counts all of them, so a
// byte is named by its offset in the whole stream. Its buffer grows as
// output comes, up to max; then the byte at offset o is at buf[o%max]
// (which also holds before it is full, when o < len(buf)).
type ring struct {
	buf []byte
	max int
	end int64 // bytes written in all
}

// start is the offset of the earliest byte kept.
func (r *ring) start() int64 { return r.end - int64(len(r.buf)) }

func (r *ring) write(p []byte) {
	for len(p) > 0 {
		if len(r.buf) < r.max {
			k := min(len(p), r.max-len(r.buf))
			r.buf = append(r.buf, p[:k]...)
			r.end += int64(k)
			p = p[k:]
			continue
		}
		if len(p) > r.max { // only its last max bytes can be kept
			r.end += int64(len(p) - r.max)
			p = p[len(p)-r.max:]
		}
		k := copy(r.buf[r.end%int64(r.max):], p)
		r.end += int64(k)
		p = p[k:]
	}
}

// read copies bytes from offset off (start() <= off <= end) into p and
// returns how many; 0 at the end.
func (r *ring) read(off int64, p []byte) int {
	if off < r.start() || off >= r.end {
		return 0
	}
	pos := int(off % int64(r.max))
	n := min(int64(len(p)), r.end-off, int64(len(r.buf)-pos))
	return copy(p, r.buf[pos:pos+int(n)])
}
