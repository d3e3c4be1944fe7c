package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/pandastack/pandastack/internal/hostagent/network"
)

// networkConfig is the network manager's configuration from c, nil when
// networking is off.
func (c *Config) networkConfig(log *slog.Logger) (*network.Config, error) {
	switch c.Network {
	case "off":
		return nil, nil
	case "on", "":
	default:
		return nil, fmt.Errorf("network %q must be on or off", c.Network)
	}
	nc := &network.Config{Prefix: c.NetworkPrefix, PoolSize: c.NetworkPoolSize, Upstreams: c.DNSUpstreams, Logger: log}
	if c.NetworkPool != "" {
		p, err := netip.ParsePrefix(c.NetworkPool)
		if err != nil {
			return nil, fmt.Errorf("network_pool %q: %w", c.NetworkPool, err)
		}
		nc.Pool = p
	}
	for _, n := range c.AllowedHostNets {
		p, err := netip.ParsePrefix(n)
		if err != nil {
			a, aerr := netip.ParseAddr(n)
			if aerr != nil {
				return nil, fmt.Errorf("allowed_host_nets %q: not a CIDR or an address", n)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		nc.AllowedHostNets = append(nc.AllowedHostNets, p.Masked())
	}
	if err := nc.Validate(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	return nc, nil
}

// hostNetwork is a host's network manager and the goroutine that keeps
// its pool filled.
type hostNetwork struct {
	m    *network.Manager
	stop context.CancelFunc
	done chan struct{}
	log  *slog.Logger
}

// openNetwork starts the network manager of cfg (nil when networking is
// off): it installs the host's table and starts filling the pool of
// prepared namespaces. What an earlier process left is removed by the
// agent's Recover, which knows which namespaces are still in use.
func openNetwork(cfg Config, log *slog.Logger) (*hostNetwork, error) {
	nc, err := cfg.networkConfig(log)
	if err != nil || nc == nil {
		return nil, err
	}
	m, err := network.New(*nc)
	if err != nil {
		return nil, fmt.Errorf("cannot set up sandbox networking (network: off turns it off): %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	nw := &hostNetwork{m: m, stop: cancel, done: make(chan struct{}), log: log}
	go func() {
		defer close(nw.done)
		if err := m.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("network manager stopped", "err", err)
		}
	}()
	return nw, nil
}

// close stops the pool and removes every namespace, or with keep (the
// VMMs keep running for the next start) only the pool's, leaving those in
// use for the next start to adopt. A nil nw does nothing.
func (nw *hostNetwork) close(keep bool) {
	if nw == nil {
		return
	}
	nw.stop()
	<-nw.done
	var err error
	if keep {
		err = nw.m.Detach()
	} else {
		err = nw.m.Close()
	}
	if err != nil {
		nw.log.Error("close network manager", "err", err)
	}
}
