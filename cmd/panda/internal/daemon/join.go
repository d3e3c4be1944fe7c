package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/fleet"
	"github.com/pandastack/pandastack/internal/hostagent"
	"golang.org/x/sys/unix"
)

// hostIDFile keeps an agent's host id across restarts.
const hostIDFile = "host.id"

// joinConfig is what an agent joins the control plane with.
type joinConfig struct {
	server    string // the control plane's REST API
	joinToken string
	reg       host.Registration // ID, URL, Token, CACert, Capacity
	// memoryMiB is the memory this host offers (Config.HostMemoryMiB;
	// 0: the machine's), cpus its CPUs (Config.HostCPUs; 0: the machine's).
	memoryMiB, cpus int
}

// prepareJoin checks cfg's join settings and returns the registration of
// this agent (its id made and kept on first start), or nil if it joins no
// control plane.
func prepareJoin(cfg Config, listen net.Addr, agentToken, caFile string) (*joinConfig, error) {
	if cfg.ServerURL == "" {
		return nil, nil
	}
	u, err := url.Parse(cfg.ServerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("server %q: want http(s)://HOST:PORT, the control plane's REST API", cfg.ServerURL)
	}
	if cfg.JoinToken == "" {
		return nil, errors.New("--server needs the join token (--token or PANDA_JOIN_TOKEN): the control plane's DATA_DIR/join.token")
	}
	id := cfg.HostID
	if id == "" {
		if id, err = loadOrCreateHostID(cfg.DataDir); err != nil {
			return nil, err
		}
	}
	if !host.ValidHostID(id) {
		return nil, fmt.Errorf("host id %q: 1-63 of a-z, 0-9 and '-', not starting with '-'", id)
	}
	adv := cfg.AdvertiseURL
	if adv == "" {
		h, port, _ := net.SplitHostPort(listen.String())
		if ip := net.ParseIP(h); ip == nil || ip.IsUnspecified() {
			return nil, fmt.Errorf("listening on every address (%s): give --advertise-url, the host API's URL as the control plane reaches it", listen)
		}
		adv = "https://" + net.JoinHostPort(h, port)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read the agent's CA: %w", err)
	}
	return &joinConfig{server: strings.TrimRight(cfg.ServerURL, "/"), joinToken: cfg.JoinToken, memoryMiB: cfg.HostMemoryMiB, cpus: cfg.HostCPUs,
		reg: host.Registration{ID: id, URL: adv, Token: agentToken, CACert: string(ca)}}, nil
}

// loadOrCreateHostID returns the host id kept in dir, making one from the
// host name on first start.
func loadOrCreateHostID(dir string) (string, error) {
	path := filepath.Join(dir, hostIDFile)
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	name, _ := os.Hostname()
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			b.WriteRune(r)
		}
	}
	id := strings.TrimLeft(b.String(), "-")
	if len(id) > 40 {
		id = id[:40]
	}
	if id == "" {
		id = "host"
	}
	// Several agents on one machine (panda dev cluster) need their own.
	id += "-" + host.NewID()[:6]
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save host id: %w", err)
	}
	return id, nil
}

// join registers the agent with the control plane, then heartbeats every
// fleet.DefaultHeartbeat until ctx ends; it registers again whenever the
// control plane does not know it (it restarted with another catalog, or an
// operator forgot the host). Failures are logged and retried.
func join(ctx context.Context, jc *joinConfig, ag *hostagent.Agent, dataDir string, out io.Writer, log *slog.Logger) {
	client := &http.Client{Timeout: 10 * time.Second}
	registered := false
	backoff := 500 * time.Millisecond
	for {
		var err error
		if !registered {
			reg := jc.reg
			reg.Capacity, reg.Load = capacity(ag, dataDir, jc.memoryMiB, jc.cpus), load(ag, dataDir, jc.memoryMiB)
			if err = post(ctx, client, jc, "/v1/fleet/join", reg); err == nil {
				registered = true
				backoff = 500 * time.Millisecond
				fmt.Fprintf(out, "Joined the control plane at %s as host %s\n", jc.server, reg.ID)
				log.Info("joined the control plane", "server", jc.server, "host_id", reg.ID, "url", reg.URL)
			}
		} else {
			err = post(ctx, client, jc, "/v1/fleet/hosts/"+jc.reg.ID+"/heartbeat", map[string]any{"token": jc.reg.Token, "load": load(ag, dataDir, jc.memoryMiB)})
			var se *statusError
			if errors.As(err, &se) && se.status == http.StatusNotFound {
				log.Warn("the control plane does not know this host: registering again", "host_id", jc.reg.ID)
				registered = false
				continue
			}
		}
		wait := fleet.DefaultHeartbeat
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("cannot reach the control plane", "server", jc.server, "err", err, "retry_ms", backoff.Milliseconds())
			wait, backoff = backoff, min(2*backoff, fleet.DefaultHeartbeat)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return fmt.Sprintf("%d: %s", e.status, e.msg) }

func post(ctx context.Context, client *http.Client, jc *joinConfig, path string, body any) error {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, jc.server+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+jc.joinToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return &statusError{status: resp.StatusCode, msg: strings.TrimSpace(string(msg))}
}

// capacity is what this host offers: its CPUs or cpus of them, its
// memory or memMiB of it (each if set and smaller), its data directory's
// disk, its accelerator.
func capacity(ag *hostagent.Agent, dataDir string, memMiB, cpus int) host.Capacity {
	res := host.LocalResources()
	c := host.Capacity{CPUs: res.VCPUs, MemoryMiB: int64(res.MemoryMiB), Accel: string(ag.Accel())}
	if memMiB > 0 {
		c.MemoryMiB = min(c.MemoryMiB, int64(memMiB))
	}
	if cpus > 0 {
		c.CPUs = min(c.CPUs, cpus)
	}
	var st unix.Statfs_t
	if unix.Statfs(dataDir, &st) == nil {
		c.DiskMiB = int64(st.Blocks) * int64(st.Bsize) >> 20
	}
	return c
}

// freeMemoryMiB is the free memory a host reports: the machine's
// MemAvailable, or, on a host offering memMiB of it, what its machines
// leave of that (inUse: bytes) if less.
func freeMemoryMiB(availMiB int64, memMiB int, inUse func() int64) int64 {
	if memMiB <= 0 {
		return availMiB
	}
	return max(0, min(availMiB, int64(memMiB)-inUse()>>20))
}

// load is this host's state now.
func load(ag *hostagent.Agent, dataDir string, memMiB int) host.Load {
	res := host.LocalResources()
	l := host.Load{FreeMemoryMiB: freeMemoryMiB(int64(res.MemoryAvailableMiB), memMiB, ag.MemoryInUse), Sandboxes: len(ag.List()), Templates: []string{}}
	var st unix.Statfs_t
	if unix.Statfs(dataDir, &st) == nil {
		l.DiskFreeMiB = int64(st.Bavail) * int64(st.Bsize) >> 20
	}
	if ts, err := ag.Templates().List(); err == nil {
		for _, t := range ts {
			if !slices.Contains(l.Templates, t.Name) {
				l.Templates = append(l.Templates, t.Name)
			}
		}
	}
	return l
}
