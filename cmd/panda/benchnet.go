package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/testing/bench"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/spf13/cobra"
)

func benchNetCmd() *cobra.Command {
	var (
		loc                     localBench
		tmpl                    string
		n, mem, transfers, size int
		requests                int
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "net",
		Short: "What sandbox networking costs: create and fork with it and without, TCP throughput, the port proxy",
		Long: `Builds a network world of its own — a "host" namespace whose only uplink
goes to an "internet" namespace holding the test servers (internal/testing/nettest)
— and runs two host agents on DATA_DIR/bench-net: one giving every sandbox a
network namespace joined to that host (its DNS upstream the world's
resolver), one without networking. No sandbox traffic leaves the world.
It measures:
  - create → first exec, with networking and without, interleaved (--n each);
  - fork → the child's first exec, likewise;
  - TCP download into a guest (busybox wget) and upload out of it (busybox
    nc), --mib MiB, --transfers times each, timed by the server;
  - an HTTP request to busybox httpd in a guest, --requests times: direct
    (agent.DialGuest: a connection from the sandbox's namespace) and through
    the API server's port proxy (/v1/sandboxes/{id}/ports/{port}/...).
Everything it makes (namespaces, veths, nftables tables, VMs) is removed
before it exits, also on errors and Ctrl-C.`,
		Example: `  panda bench net --template tiny --n 20
  panda bench net --n 3 --mib 8 --transfers 2 --requests 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return fmt.Errorf("--n %d: want at least 1", n)
			}
			res, err := runNetBench(cmd.Context(), loc, bench.NetOptions{
				Template: tmpl, MemoryMiB: mem, N: n, Transfers: transfers, MiB: size, Requests: requests,
				Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			printNetResult(cmd.OutOrStdout(), res)
			return nil
		},
	}
	f := cmd.Flags()
	loc.register(f)
	f.StringVar(&tmpl, "template", "tiny", "template (tiny or base)")
	f.IntVar(&mem, "memory", 256, "guest memory in MiB")
	f.IntVar(&n, "n", 20, "creates and forks measured, with networking and without each")
	f.IntVar(&transfers, "transfers", 5, "downloads and uploads measured")
	f.IntVar(&size, "mib", 64, "size of each download and upload, MiB")
	f.IntVar(&requests, "requests", 200, "HTTP requests measured, direct and through the proxy each")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// runNetBench builds the world, runs the benchmark in it and takes
// everything down again, in the reverse order of its making.
func runNetBench(ctx context.Context, loc localBench, o bench.NetOptions) (res bench.NetResult, err error) {
	env, err := nettest.Build()
	if err != nil {
		return res, fmt.Errorf("cannot build the benchmark's network namespaces: %w", err)
	}
	defer env.Close()

	var b [2]byte
	rand.Read(b[:])
	m, err := network.New(network.Config{
		Prefix:    "nb" + hex.EncodeToString(b[:]),
		HostNetNS: env.Host.Path,
		Upstreams: []string{nettest.DNSAddr.String()},
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return res, fmt.Errorf("cannot start the network manager: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		m.Run(runCtx)
	}()
	defer func() {
		stop()
		<-ran
		if cerr := m.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("close the network manager: %w", cerr))
		}
	}()

	// Both agents on one data directory (one template bake, one store):
	// the one with the API opens first and so mounts the store and
	// unmounts it last.
	cfg := loc.agentConfig("bench-net")
	on := cfg
	on.Network = m
	st, err := startLocalStack(ctx, on)
	if err != nil {
		return res, err
	}
	defer st.close()
	off, err := openAgent(ctx, cfg)
	if err != nil {
		return res, err
	}
	defer off.Close()

	return bench.NetBench(ctx, bench.NetWorld{
		Off: off, On: st.agent, API: st.client, APIKey: st.key,
		Listen:     func(addr string) (net.Listener, error) { return env.Internet.Listen("tcp4", addr) },
		ServerIP:   nettest.WebAddr.String(),
		ServerName: "allowed.test",
	}, o)
}

func printNetResult(out io.Writer, res bench.NetResult) {
	fmt.Fprintf(out, "template %s, %d MiB, %s; networking in the benchmark's own namespaces\n", res.Template, res.MemoryMiB, res.Accel)
	fmt.Fprintf(out, "create → first exec: without networking p50 %.1f ms %s %.1f ms; with p50 %.1f ms %s %.1f ms (n=%d); ratio %.2f (target ≤ 1.10)\n",
		res.CreateOff.P50, res.CreateOff.TailName(), res.CreateOff.P99, res.CreateOn.P50, res.CreateOn.TailName(), res.CreateOn.P99, res.CreateOn.N, res.CreateRatio)
	fmt.Fprintf(out, "fork → child exec:   without networking p50 %.1f ms %s %.1f ms; with p50 %.1f ms %s %.1f ms (n=%d); ratio %.2f (target ≤ 1.10)\n",
		res.ForkOff.P50, res.ForkOff.TailName(), res.ForkOff.P99, res.ForkOn.P50, res.ForkOn.TailName(), res.ForkOn.P99, res.ForkOn.N, res.ForkRatio)
	if res.Download.N > 0 {
		fmt.Fprintf(out, "TCP, %d MiB each (n=%d): download p50 %.1f MB/s (slowest %.1f); upload p50 %.1f MB/s (slowest %.1f) (target ≥ 100)\n",
			res.TransferMiB, res.Download.N, res.Download.P50, res.Download.Min, res.Upload.P50, res.Upload.Min)
	}
	if res.Direct.N > 0 {
		fmt.Fprintf(out, "HTTP request to the guest (n=%d): direct p50 %.0f µs %s %.0f µs; port proxy p50 %.0f µs %s %.0f µs; proxy adds %.0f µs at p50 (target ≤ 5000)\n",
			res.Direct.N, res.Direct.P50, res.Direct.TailName(), res.Direct.P99, res.Proxy.P50, res.Proxy.TailName(), res.Proxy.P99, res.ProxyOverheadUS)
	}
}
