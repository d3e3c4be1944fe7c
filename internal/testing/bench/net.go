package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// NetWorld is what NetBench measures in. Off and On are host agents on
// one data directory (the same template images); On gives every sandbox
// a network namespace (agent.Config.Network) whose host must be a
// namespace of the caller's, joined only to a namespace of the caller's
// that stands in for the internet: no sandbox traffic of the benchmark
// may leave them. Off gives none (Config.Network nil).
type NetWorld struct {
	Off, On *hostagent.Agent
	// API is a client of an api.Server over On (for its port proxy),
	// with APIKey, a key that may create sandboxes.
	API    *pandastack.Client
	APIKey string
	// Listen listens on addr ("ip:port") in the internet namespace;
	// ServerIP is an address there that guests reach as ServerName
	// (through the world's resolver).
	Listen     func(addr string) (net.Listener, error)
	ServerIP   string
	ServerName string
}

// NetOptions configures NetBench.
type NetOptions struct {
	Template  string
	MemoryMiB int
	N         int // creates and forks measured, with networking and without each
	Transfers int // downloads and uploads measured
	MiB       int // size of each download and upload
	Requests  int // HTTP requests measured, direct and through the proxy each
	Log       io.Writer
}

// NetResult is the output of `panda bench net`.
type NetResult struct {
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	Accel     string `json:"accel"`
	// Create → first exec of true, with and without networking,
	// interleaved; Ratio is the with/without ratio of the medians.
	CreateOff   Dist    `json:"create_to_first_exec_off"`
	CreateOn    Dist    `json:"create_to_first_exec_on"`
	CreateRatio float64 `json:"create_ratio"`
	// Fork → child's first exec of true, likewise.
	ForkOff   Dist    `json:"fork_to_child_exec_off"`
	ForkOn    Dist    `json:"fork_to_child_exec_on"`
	ForkRatio float64 `json:"fork_ratio"`
	// TCP throughput between a guest and a server in the internet
	// namespace, MB/s (10^6 bytes), timed by the server.
	TransferMiB int        `json:"transfer_mib"`
	Download    Throughput `json:"download"`
	Upload      Throughput `json:"upload"`
	// One HTTP request (new TCP connection to the guest each time) to
	// busybox httpd in a guest: direct (agent.DialGuest, which is the
	// sandbox Namespace.DialContext to the guest's address) and through
	// the API server's port proxy (HTTP over loopback TCP, keep-alive).
	Direct          LatencyUS `json:"direct"`
	Proxy           LatencyUS `json:"proxy"`
	ProxyOverheadUS float64   `json:"proxy_overhead_p50_us"`
}

// Throughput summarizes transfer rates in MB/s; Min is the slowest.
type Throughput struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_mb_s"`
	Min float64 `json:"min_mb_s"`
	Max float64 `json:"max_mb_s"`
}

// LatencyUS summarizes samples in microseconds.
type LatencyUS struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_us"`
	P99 float64 `json:"p99_us"` // the maximum when N < 100 (TailName)
}

// TailName is TailName(l.N).
func (l LatencyUS) TailName() string { return TailName(l.N) }

// Ports of NetBench's servers: in the internet namespace (download and
// upload) and in the guest (httpd).
const (
	netDownloadPort = 8080
	netUploadPort   = 8081
	netGuestPort    = 8080
)

// NetBench measures what sandbox networking costs: create and fork with
// it against without, TCP throughput into and out of a guest, and a
// request through the port proxy against a direct connection. Every
// sandbox it makes is killed before it returns.
func NetBench(ctx context.Context, w NetWorld, o NetOptions) (NetResult, error) {
	res := NetResult{Template: o.Template, MemoryMiB: o.MemoryMiB, Accel: string(w.On.Accel()), TransferMiB: o.MiB}
	b := &netRun{w: w, o: o}
	defer b.killAll()
	// Online, as the API makes every sandbox that asks for no policy.
	req := hostagent.CreateRequest{Template: o.Template, MemoryMiB: o.MemoryMiB, Network: netpolicy.Default()}
	b.req = req

	b.logf("warming up (bakes the template if needed)")
	wreq := req
	wreq.Progress = func(m string) { b.logf("  %s", m) }
	for _, a := range []*hostagent.Agent{w.Off, w.On} {
		id, err := b.create(ctx, a, wreq)
		if err != nil {
			return res, err
		}
		b.kill(a, id)
	}

	// Create → first exec, interleaved (the order alternating) so that
	// the load of whatever else runs on the machine falls on both.
	var off, on []time.Duration
	for i := range o.N {
		for _, withNet := range order(i) {
			a := w.Off
			if withNet {
				a = w.On
			}
			t0 := time.Now()
			id, err := b.create(ctx, a, req)
			if err != nil {
				return res, fmt.Errorf("create %d: %w", i, err)
			}
			d := time.Since(t0)
			b.kill(a, id)
			if withNet {
				on = append(on, d)
			} else {
				off = append(off, d)
			}
		}
	}
	res.CreateOff, res.CreateOn = Summarize(off), Summarize(on)
	res.CreateRatio = ratio(res.CreateOn.P50, res.CreateOff.P50)
	b.logf("create → first exec: %.1f ms without networking, %.1f ms with (x%.2f)", res.CreateOff.P50, res.CreateOn.P50, res.CreateRatio)

	// Fork → child's first exec, interleaved likewise.
	parents := map[bool]string{}
	for _, withNet := range []bool{false, true} {
		a := w.Off
		if withNet {
			a = w.On
		}
		id, err := b.create(ctx, a, req)
		if err != nil {
			return res, err
		}
		parents[withNet] = id
		// One unmeasured fork each: the first capture of a parent
		// translates its code paths for the first time.
		if _, err := b.fork(ctx, a, id); err != nil {
			return res, err
		}
	}
	off, on = nil, nil
	for i := range o.N {
		for _, withNet := range order(i) {
			a := w.Off
			if withNet {
				a = w.On
			}
			d, err := b.fork(ctx, a, parents[withNet])
			if err != nil {
				return res, fmt.Errorf("fork %d: %w", i, err)
			}
			if withNet {
				on = append(on, d)
			} else {
				off = append(off, d)
			}
		}
	}
	b.kill(w.Off, parents[false])
	b.kill(w.On, parents[true])
	res.ForkOff, res.ForkOn = Summarize(off), Summarize(on)
	res.ForkRatio = ratio(res.ForkOn.P50, res.ForkOff.P50)
	b.logf("fork → child exec: %.1f ms without networking, %.1f ms with (x%.2f)", res.ForkOff.P50, res.ForkOn.P50, res.ForkRatio)

	if err := b.throughput(ctx, &res); err != nil {
		return res, err
	}
	if err := b.latency(ctx, &res); err != nil {
		return res, err
	}
	return res, nil
}

// order is which of the two runs first in round i.
func order(i int) []bool {
	if i%2 == 0 {
		return []bool{false, true}
	}
	return []bool{true, false}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return math.Round(a/b*100) / 100
}

type netRun struct {
	w    NetWorld
	o    NetOptions
	req  hostagent.CreateRequest // of every sandbox but the API's
	live []struct {
		a  *hostagent.Agent
		id string
	}
}

func (b *netRun) logf(format string, args ...any) {
	if b.o.Log != nil {
		fmt.Fprintf(b.o.Log, format+"\n", args...)
	}
}

// create makes a sandbox and runs true in it.
func (b *netRun) create(ctx context.Context, a *hostagent.Agent, req hostagent.CreateRequest) (string, error) {
	info, err := a.Create(ctx, req)
	if err != nil {
		return "", err
	}
	b.track(a, info.ID)
	return info.ID, b.execTrue(ctx, a, info.ID)
}

// fork forks parent once and returns the time until the child answered
// true; the child is killed.
func (b *netRun) fork(ctx context.Context, a *hostagent.Agent, parent string) (time.Duration, error) {
	cid := host.NewID()
	t0 := time.Now()
	fr, err := a.Fork(ctx, parent, []string{cid})
	if err == nil && len(fr.Children) == 1 && fr.Children[0].Err != nil {
		err = fr.Children[0].Err
	}
	if err != nil {
		a.Kill(context.Background(), cid)
		return 0, err
	}
	b.track(a, cid)
	if err := b.execTrue(ctx, a, cid); err != nil {
		return 0, err
	}
	d := time.Since(t0)
	b.kill(a, cid)
	return d, nil
}

func (b *netRun) execTrue(ctx context.Context, a *hostagent.Agent, id string) error {
	r, err := a.Exec(ctx, id, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil)
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exit %d", r.ExitCode)
	}
	if err != nil {
		return fmt.Errorf("first exec in %s: %w", id, err)
	}
	return nil
}

// shTimeout bounds every shell command NetBench runs in a guest.
const shTimeout = 5 * time.Minute

// sh runs a shell command in id and fails unless it exits 0.
func (b *netRun) sh(ctx context.Context, a *hostagent.Agent, id, cmd string) (string, error) {
	var out, errb bytes.Buffer
	r, err := a.Exec(ctx, id, guestproto.ExecRequest{Shell: cmd, TimeoutMS: shTimeout.Milliseconds()}, nil, &out, &errb)
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", r.ExitCode, strings.TrimSpace(errb.String()))
	}
	if err != nil {
		return "", fmt.Errorf("%q in %s: %w", cmd, id, err)
	}
	return out.String(), nil
}

func (b *netRun) track(a *hostagent.Agent, id string) {
	b.live = append(b.live, struct {
		a  *hostagent.Agent
		id string
	}{a, id})
}

func (b *netRun) kill(a *hostagent.Agent, id string) {
	a.Kill(context.Background(), id)
	for i, l := range b.live {
		if l.a == a && l.id == id {
			b.live = append(b.live[:i], b.live[i+1:]...)
			break
		}
	}
}

func (b *netRun) killAll() {
	for _, l := range b.live {
		l.a.Kill(context.Background(), l.id)
	}
	b.live = nil
}

// transfer is what a server saw of one transfer.
type transfer struct {
	bytes int64
	dur   time.Duration
	err   error
}

// throughput downloads and uploads o.MiB o.Transfers times each between
// a guest (busybox wget) and servers in the internet namespace,
// which time each from accepting the connection to the last byte (for a
// download: until the guest, having read every byte, closes).
func (b *netRun) throughput(ctx context.Context, res *NetResult) error {
	if b.o.Transfers <= 0 || b.o.MiB <= 0 {
		return nil
	}
	size := int64(b.o.MiB) << 20
	dl, err := b.w.Listen(net.JoinHostPort(b.w.ServerIP, strconv.Itoa(netDownloadPort)))
	if err != nil {
		return fmt.Errorf("download server: %w", err)
	}
	defer dl.Close()
	ul, err := b.w.Listen(net.JoinHostPort(b.w.ServerIP, strconv.Itoa(netUploadPort)))
	if err != nil {
		return fmt.Errorf("upload server: %w", err)
	}
	defer ul.Close()
	downs, ups := make(chan transfer, 1), make(chan transfer, 1)
	go serveTransfers(dl, downs, func(c net.Conn) (int64, error) { return sendHTTP(c, size) })
	go serveTransfers(ul, ups, receiveHTTP)

	id, err := b.create(ctx, b.w.On, b.req)
	if err != nil {
		return err
	}
	defer b.kill(b.w.On, id)
	// Not wget -T: it crashes in busybox 1.35; timeout bounds both.
	wget := fmt.Sprintf("timeout 300 wget -q -O /dev/null http://%s:%d/big", b.w.ServerName, netDownloadPort)
	// Upload with wget --post-file, which sends the file in large writes
	// (busybox nc copies 1 KiB at a time: some 3 MB/s under TCG, a
	// measure of nc). It sends the file as a string, so no zero bytes.
	post := fmt.Sprintf("timeout 300 wget -q -O /dev/null --post-file /tmp/upload http://%s:%d/", b.w.ServerName, netUploadPort)
	if _, err := b.sh(ctx, b.w.On, id, fmt.Sprintf(`head -c %d /dev/zero | tr '\0' a > /tmp/upload`, size)); err != nil {
		return err
	}
	var down, up []float64
	// One unmeasured transfer each way first (DNS, ARP, code paths).
	for i := -1; i < b.o.Transfers; i++ {
		for _, t := range []struct {
			cmd  string
			seen chan transfer
			out  *[]float64
		}{{wget, downs, &down}, {post, ups, &up}} {
			if _, err := b.sh(ctx, b.w.On, id, t.cmd); err != nil {
				return err
			}
			var tr transfer
			select {
			case tr = <-t.seen:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("%q: the server saw no transfer", t.cmd)
			}
			if tr.err != nil || tr.bytes != size {
				return fmt.Errorf("%q: the server moved %d of %d bytes: %v", t.cmd, tr.bytes, size, tr.err)
			}
			if i >= 0 {
				*t.out = append(*t.out, float64(size)/1e6/tr.dur.Seconds())
			}
		}
	}
	res.Download, res.Upload = summarizeRates(down), summarizeRates(up)
	b.logf("throughput (%d MiB): download %.1f MB/s, upload %.1f MB/s", b.o.MiB, res.Download.P50, res.Upload.P50)
	return nil
}

// serveTransfers serves one connection at a time until l closes,
// reporting each on seen.
func serveTransfers(l net.Listener, seen chan<- transfer, serve func(net.Conn) (int64, error)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		t0 := time.Now()
		c.SetDeadline(t0.Add(5 * time.Minute))
		n, err := serve(c)
		d := time.Since(t0)
		c.Close()
		select { // never blocks: a transfer nobody waits for is dropped
		case seen <- transfer{bytes: n, dur: d, err: err}:
		default:
		}
	}
}

// sendHTTP answers one HTTP request with size zero bytes and returns once
// the client, having read them, closed the connection.
func sendHTTP(c net.Conn, size int64) (int64, error) {
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("read request: %w", err)
		}
		if line == "\r\n" || line == "\n" {
			break
		}
	}
	if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n", size); err != nil {
		return 0, err
	}
	n, err := io.Copy(c, io.LimitReader(zeros{}, size))
	if err != nil {
		return n, err
	}
	// The transfer ends when the client has every byte: it closes then.
	if _, err := io.Copy(io.Discard, br); err != nil {
		return n, fmt.Errorf("wait for the client to close: %w", err)
	}
	return n, nil
}

// receiveHTTP reads one HTTP request with a body (Content-Length), answers
// 200 and returns the body's length.
func receiveHTTP(c net.Conn) (int64, error) {
	br := bufio.NewReader(c)
	length := int64(-1)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("read request: %w", err)
		}
		if line == "\r\n" || line == "\n" {
			break
		}
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "content-length") {
			length, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if length < 0 {
		return 0, errors.New("request without Content-Length")
	}
	n, err := io.Copy(io.Discard, io.LimitReader(br, length))
	if err != nil {
		return n, err
	}
	_, err = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func summarizeRates(v []float64) Throughput {
	if len(v) == 0 {
		return Throughput{}
	}
	sort.Float64s(v)
	return Throughput{N: len(v), P50: Percentile(v, 50), Min: round(v[0]), Max: round(v[len(v)-1])}
}

func summarizeUS(d []time.Duration) LatencyUS {
	if len(d) == 0 {
		return LatencyUS{}
	}
	us := make([]float64, len(d))
	for i, v := range d {
		us[i] = float64(v.Nanoseconds()) / 1000
	}
	sort.Float64s(us)
	return LatencyUS{N: len(us), P50: math.Round(Percentile(us, 50)), P99: math.Round(Percentile(us, 99))}
}

// latency times o.Requests HTTP requests to busybox httpd in a guest,
// alternating a direct connection (agent.DialGuest) and the API's port
// proxy.
func (b *netRun) latency(ctx context.Context, res *NetResult) error {
	if b.o.Requests <= 0 {
		return nil
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	// Through the API, so that its port proxy knows the sandbox.
	sb, err := b.w.API.Create(ctx, pandastack.CreateOptions{Template: b.o.Template, MemoryMiB: b.o.MemoryMiB, TTLSeconds: 1800})
	if err != nil {
		return fmt.Errorf("create through the API: %w", err)
	}
	id := sb.ID
	defer func() {
		sb.Kill(context.Background())
		b.w.On.Kill(context.Background(), id) // in case the API could not
	}()
	if _, err := b.sh(ctx, b.w.On, id, fmt.Sprintf(
		"mkdir -p /tmp/www && echo ok > /tmp/www/index.html && busybox httpd -p %d -h /tmp/www", netGuestPort)); err != nil {
		return err
	}
	direct := func() error {
		c, err := b.w.On.DialGuest(ctx, id, netGuestPort)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\nHost: guest\r\n\r\n"); err != nil {
			return err
		}
		body, err := io.ReadAll(c)
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(body, []byte("HTTP/1.")) || !bytes.Contains(body[:min(len(body), 16)], []byte(" 200")) || !bytes.HasSuffix(body, []byte("ok\n")) {
			return fmt.Errorf("direct GET: unexpected answer %q", body)
		}
		return nil
	}
	url := fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/index.html", strings.TrimSuffix(b.w.API.APIURL(), "/"), id, netGuestPort)
	proxied := func() error {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+b.w.APIKey)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || string(body) != "ok\n" {
			return fmt.Errorf("GET through the proxy: %s %q", resp.Status, body)
		}
		return nil
	}
	// httpd starts in the background: wait until it answers.
	deadline := time.Now().Add(30 * time.Second)
	for err := direct(); err != nil; err = direct() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("httpd in %s does not answer: %w", id, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var ds, ps []time.Duration
	const warm = 5
	for i := -warm; i < b.o.Requests; i++ {
		for _, d := range []struct {
			fn  func() error
			out *[]time.Duration
		}{{direct, &ds}, {proxied, &ps}} {
			t0 := time.Now()
			if err := d.fn(); err != nil {
				return err
			}
			if i >= 0 {
				*d.out = append(*d.out, time.Since(t0))
			}
		}
	}
	res.Direct, res.Proxy = summarizeUS(ds), summarizeUS(ps)
	res.ProxyOverheadUS = res.Proxy.P50 - res.Direct.P50
	b.logf("request: direct p50 %.0f µs, through the proxy %.0f µs", res.Direct.P50, res.Proxy.P50)
	return nil
}
