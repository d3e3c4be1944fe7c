package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/testing/devcluster"
	"github.com/pandastack/pandastack/internal/testing/versitygw"
	"github.com/spf13/cobra"
)

func devCmd() *cobra.Command {
	dev := &cobra.Command{
		Use:   "dev",
		Short: "Tools for trying PandaStack on one machine",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	dev.AddCommand(devClusterCmd())
	return dev
}

func devClusterCmd() *cobra.Command {
	d := devcluster.Defaults()
	var (
		agents          int
		dataDir, listen string
		store, images   string
		defaultTemplate string
		defaultMemory   int
		agentMemory     int
		agentCPUs       int
		hostLostAfter   time.Duration
		lazyRestore     bool
		name, subnet    string
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Run a whole fleet on this machine: PostgreSQL, an object store, N host agents and the control plane",
		Long: `Run, in the foreground, a PandaStack fleet on this machine for trying it:

  - PostgreSQL holding the catalog (DATA_DIR/postgres, initdb on first start);
  - an object store the agents share: versitygw (an S3-compatible server,
    built by make s3-deps) on the bridge, or a directory (--store dir), or
    none;
  - N host agents (panda agent), each in a network namespace of its own
    (pdev-aN, joined to a bridge pdev-br by a veth pair; no route beyond it),
    with its own data directory DATA_DIR/agent-N, host id agent-N, and
    networking off: sandboxes in a dev cluster have NO network;
  - the control plane (panda server --fleet) on --listen, which the agents
    join (through a forwarder on the bridge when it listens on loopback).

The admin API key is in DATA_DIR/admin.key, as with panda up; the command
prints how to use it. The agents bake their default template on first start
(a few seconds each under TCG). Ctrl-C or SIGTERM stops everything and
removes the namespaces, veths and bridge; the data directory stays, unless it
was a temporary one (no --data-dir). A run that was killed (SIGKILL) leaves
things behind: the next run cleans them up first.

Needs root. Logs: DATA_DIR/logs. See docs/dev-cluster.md.`,
		Example: `  sudo panda dev cluster --agents 3 --data-dir /var/lib/pandastack-dev
  export PANDASTACK_API_URL=http://127.0.0.1:7788 PANDASTACK_API_KEY=$(sudo cat /var/lib/pandastack-dev/admin.key)
  curl -s -H "Authorization: Bearer $PANDASTACK_API_KEY" $PANDASTACK_API_URL/v1/sandboxes \
    -d '{"placement": {"host": "agent-2"}}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bin, err := os.Executable()
			if err != nil {
				return err
			}
			gw := os.Getenv("PANDA_VERSITYGW")
			if gw == "" {
				if gw, err = versitygw.DefaultBinary(); err != nil {
					return err
				}
			}
			if images == "" {
				images = d.Images
			}
			net, err := netip.ParsePrefix(subnet)
			if err != nil {
				return fmt.Errorf("--subnet: %w", err)
			}
			cfg := devcluster.Config{Agents: agents, DataDir: dataDir, Listen: listen, Store: store, Images: images,
				Binary: bin, Versitygw: gw, Env: os.Environ(), Out: cmd.OutOrStdout(), Name: name, Subnet: net,
				AgentArgs:      []string{"--default-template", defaultTemplate, "--default-memory", fmt.Sprint(defaultMemory)},
				AgentMemoryMiB: agentMemory, AgentCPUs: agentCPUs}
			if lazyRestore {
				if store == devcluster.StoreNone {
					return fmt.Errorf("--lazy-restore needs an object store (--store s3 or dir)")
				}
				cfg.AgentArgs = append(cfg.AgentArgs, "--lazy-restore")
			}
			if hostLostAfter > 0 {
				cfg.ServerArgs = []string{"--host-lost-after", hostLostAfter.String()}
			}
			return runDevCluster(cmd, cfg)
		},
	}
	f := cmd.Flags()
	f.IntVar(&agents, "agents", d.Agents, "host agents to run")
	f.StringVar(&dataDir, "data-dir", "", "data directory, kept after the cluster stops (default: a temporary one, removed)")
	f.StringVar(&listen, "listen", d.Listen, "address of the control plane's REST API")
	f.StringVar(&store, "store", d.Store, "object store of the agents: s3 (versitygw), dir (a shared directory) or none")
	f.StringVar(&images, "images", "", "guest images from make setup (default "+d.Images+")")
	f.StringVar(&defaultTemplate, "default-template", "base", "template of creates that name none (each agent bakes it at start)")
	f.IntVar(&defaultMemory, "default-memory", 1024, "guest memory (MiB) of creates that give none")
	f.StringVar(&name, "name", d.Name, "prefix of the cluster's namespaces, veths and bridge (1-5 of a-z, 0-9): one per cluster running at once")
	f.StringVar(&subnet, "subnet", d.Subnet.String(), "IPv4 network of the bridge joining the agents (/24 or larger; must not overlap this machine's)")
	f.BoolVar(&lazyRestore, "lazy-restore", false, "agents restore snapshots and paused sandboxes they do not hold with memory paged in on first touch (docs/lazy-restore.md)")
	f.IntVar(&agentCPUs, "agent-cpus", 0, "CPUs each agent offers the fleet (default: the machine's shared out among them, at least one each; -1: all of them each)")
	f.IntVar(&agentMemory, "agent-memory", 0, "memory (MiB) each agent offers the fleet (default: the machine's shared out among them, plus the 1 GiB the scheduler keeps free on each; -1: the whole machine's each)")
	f.DurationVar(&hostLostAfter, "host-lost-after", 0, "a host that misses heartbeats this long is lost (default: the server's, 10s)")
	return cmd
}

// runDevCluster starts the cluster, prints how to reach it, and stops it
// when the command's context ends (SIGINT, SIGTERM).
func runDevCluster(cmd *cobra.Command, cfg devcluster.Config) error {
	ctx := cmd.Context()
	out := cmd.OutOrStdout()
	c, err := devcluster.Start(ctx, cfg)
	if err != nil {
		return err
	}
	printDevCluster(out, c)
	werr := c.Wait(ctx)
	fmt.Fprintln(out, "Stopping the dev cluster…")
	began := time.Now()
	if err := c.Close(); err != nil {
		return err
	}
	if c.Temporary() {
		fmt.Fprintf(out, "Stopped in %v; removed everything, the temporary data directory too.\n", time.Since(began).Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(out, "Stopped in %v; removed everything but the data directory %s.\n", time.Since(began).Round(100*time.Millisecond), c.DataDir())
	}
	return werr
}

func printDevCluster(out io.Writer, c *devcluster.Cluster) {
	keyFile := c.AdminKeyFile()
	fmt.Fprintf(out, "\nPandaStack dev cluster\n")
	fmt.Fprintf(out, "  API           %s\n", c.URL())
	fmt.Fprintf(out, "  admin key     %s\n", keyFile)
	fmt.Fprintf(out, "  catalog       PostgreSQL in %s\n", filepath.Join(c.DataDir(), "postgres"))
	if s := c.StoreURL(); s != "" {
		fmt.Fprintf(out, "  object store  %s\n", s)
	} else {
		fmt.Fprintf(out, "  object store  none\n")
	}
	fmt.Fprintf(out, "  logs          %s\n", c.LogDir())
	var share []string
	if n := c.AgentCPUs(); n > 0 {
		share = append(share, fmt.Sprintf("%d of its CPUs (--agent-cpus)", n))
	}
	if m := c.AgentMemoryMiB(); m > 0 {
		share = append(share, fmt.Sprintf("%d MiB of its memory (--agent-memory)", m))
	}
	if len(share) > 0 {
		fmt.Fprintf(out, "  hosts         each offers this machine's %s\n", strings.Join(share, " and "))
	} else {
		fmt.Fprintf(out, "  hosts\n")
	}
	for _, a := range c.Agents() {
		fmt.Fprintf(out, "    %-9s %s  (namespace %s, data %s, pid %d)\n", a.ID, a.URL, filepath.Base(a.NetNS), a.DataDir, a.PID())
	}
	fmt.Fprintf(out, "\nSandboxes in this cluster have no network (the agents run with --network off).\n")
	fmt.Fprintf(out, "Templates you build (panda template build) are built on the agent with the most free memory; the others fetch them from the object store.\n")
	fmt.Fprintf(out, "\nUse it:\n")
	fmt.Fprintf(out, "  export PANDASTACK_API_URL=%s PANDASTACK_API_KEY=$(cat %s)\n", c.URL(), keyFile)
	fmt.Fprintf(out, "  panda create && panda ls\n")
	fmt.Fprintf(out, "  curl -s -H \"Authorization: Bearer $PANDASTACK_API_KEY\" $PANDASTACK_API_URL/v1/hosts\n")
	fmt.Fprintf(out, "\nCtrl-C stops everything.\n")
}
