package rest

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// portJSON is one listening TCP socket of a guest.
type portJSON struct {
	Port    int    `json:"port"`
	Address string `json:"address"` // 0.0.0.0 and :: are every address
}

// Bounds on what a guest's /proc/net/tcp{,6} may make the server read and
// keep: the guest is not trusted.
const (
	maxProcNetBytes = 32 << 20
	maxListeners    = 4096
)

// listPorts lists the TCP sockets listening in a running guest, read from
// its /proc/net/tcp and /proc/net/tcp6 through the guest agent.
func (s *Server) listPorts(w http.ResponseWriter, r *http.Request) {
	g, err := s.guestFor(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var out []portJSON
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		ports, err := readListeners(r.Context(), g, f)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out = append(out, ports...)
	}
	out = dedupPorts(out)
	if len(out) > maxListeners {
		out = out[:maxListeners]
	}
	writeJSON(w, http.StatusOK, map[string]any{"ports": out})
}

// readListeners reads one /proc/net/tcp file of the guest. A missing file
// (a guest without IPv6) lists nothing.
func readListeners(ctx context.Context, g host.Guest, path string) ([]portJSON, error) {
	rc, _, err := g.ReadFile(ctx, path)
	if guestproto.CodeOf(err) == guestproto.CodeNotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	ports, err := parseProcNetTCP(io.LimitReader(rc, maxProcNetBytes))
	if err != nil {
		return nil, err
	}
	return ports, nil
}

// tcpListen is the st field of a listening socket (TCP_LISTEN).
const tcpListen = "0A"

// parseProcNetTCP returns the listening sockets of a /proc/net/tcp or
// /proc/net/tcp6 file: a header line, then one socket a line, "sl
// local_address rem_address st ...", local_address being the address in
// hex as the kernel stores it (32-bit words in the guest's byte order,
// little-endian on x86) and the port in hex. Malformed lines are skipped.
func parseProcNetTCP(r io.Reader) ([]portJSON, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	var out []portJSON
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) < 4 || f[3] != tcpListen {
			continue
		}
		addr, port, ok := parseProcAddr(f[1])
		if !ok {
			continue
		}
		if len(out) < maxListeners {
			out = append(out, portJSON{Port: port, Address: addr})
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			// The guest's kernel writes short lines: the guest is lying.
			return nil, guestproto.Errorf(guestproto.CodeInternal, "a line of its /proc/net/tcp is longer than 64 KiB")
		}
		return nil, err
	}
	return out, nil
}

// parseProcAddr decodes "0100007F:1F40" (127.0.0.1:8000) or its 32-digit
// IPv6 form.
func parseProcAddr(s string) (string, int, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return "", 0, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil || port == 0 {
		return "", 0, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return "", 0, false
	}
	// Each 32-bit word is in the guest's (little-endian) order.
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	ip, _ := netip.AddrFromSlice(raw)
	return ip.String(), int(port), true
}

// dedupPorts sorts by port then address and drops repeats (a socket per
// CPU with SO_REUSEPORT).
func dedupPorts(ps []portJSON) []portJSON {
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].Port != ps[j].Port {
			return ps[i].Port < ps[j].Port
		}
		return ps[i].Address < ps[j].Address
	})
	out := make([]portJSON, 0, len(ps))
	for i, p := range ps {
		if i == 0 || p != ps[i-1] {
			out = append(out, p)
		}
	}
	return out
}
