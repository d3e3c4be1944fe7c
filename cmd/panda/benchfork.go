package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/testing/bench"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// localStack is a private all-in-one server for benchmarks that need the
// host agent next to the API (memory figures, the naive fork baseline).
type localStack struct {
	agent  *hostagent.Agent
	client *pandastack.Client
	url    string // the API server's
	key    string // the client's, an admin key
	close  func()
}

// startLocalStack opens a host agent as cfg says (DataDir, ImagesDir,
// Accel, Network; it adopts a mounted store and logs nothing) with an
// API server over it on a random loopback port.
func startLocalStack(ctx context.Context, cfg hostagent.Config) (*localStack, error) {
	var exited atomic.Pointer[controlplane.Plane]
	dataDir := cfg.DataDir
	cfg.AdoptMount = true
	cfg.OnExit = func(id string, err error) {
		if cp := exited.Load(); cp != nil {
			cp.SandboxExited(id, err)
		}
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	a, err := openAgent(ctx, cfg)
	if err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(dataDir, "bench.db"))
	cat, err := sqlite.Open(ctx, filepath.Join(dataDir, "bench.db"))
	if err != nil {
		a.Close()
		return nil, err
	}
	reg := prometheus.NewRegistry()
	cp, err := controlplane.New(controlplane.Config{MaxSandboxesPerKey: 1000, MaxMemoryMiBPerKey: 1 << 30}, cat, hostagent.Local(a), reg)
	if err != nil {
		cat.Close()
		a.Close()
		return nil, err
	}
	exited.Store(cp)
	srv, err := rest.New(rest.Config{}, cp, cat, hostagent.Local(a), reg)
	if err != nil {
		cat.Close()
		a.Close()
		return nil, err
	}
	_, secret, err := rest.NewKey(ctx, cat, "bench", true, 0, 0)
	if err != nil {
		cat.Close()
		a.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cat.Close()
		a.Close()
		return nil, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	c, err := pandastack.NewClient(pandastack.Options{APIURL: "http://" + ln.Addr().String(), APIKey: secret})
	if err != nil {
		hs.Close()
		cat.Close()
		a.Close()
		return nil, err
	}
	return &localStack{agent: a, client: c, url: "http://" + ln.Addr().String(), key: secret, close: func() {
		hs.Close()
		a.Close()
		cat.Close()
	}}, nil
}

func benchForkCmd() *cobra.Command {
	var (
		loc                                 localBench
		tmpl, sizes                         string
		rounds, dirty, fanout, fanRuns, mem int
		memChildren, childDirty             int
		asJSON                              bool
	)
	cmd := &cobra.Command{
		Use:   "fork",
		Short: "Fork latency across guest RAM sizes, parent pause, fan-out, and memory against a naive copy",
		Long: `Runs a private server (its own data directory, DATA_DIR/bench) and measures,
through the HTTP API:
  - fork → child's first exec and the parent's pause, for each guest RAM size,
    with the parent having dirtied --dirty MiB;
  - fork(count=--fanout) until every child answered;
  - the host PSS that --mem-children children add when each dirties
    --child-dirty MiB, beside the same children made as naive full copies.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var memSizes []int
			for _, f := range strings.Split(sizes, ",") {
				v, err := strconv.Atoi(strings.TrimSpace(f))
				if err != nil || v <= 0 {
					return fmt.Errorf("--sizes: %q is not a size in MiB", f)
				}
				memSizes = append(memSizes, v)
			}
			st, err := startLocalStack(ctx, loc.agentConfig("bench"))
			if err != nil {
				return err
			}
			defer st.close()
			res, err := bench.ForkBench(ctx, st.client, st.agent, bench.ForkOptions{
				Template: tmpl, MemorySizes: memSizes, Rounds: rounds, DirtyMiB: dirty,
				Fanout: fanout, FanoutRuns: fanRuns, MemChildren: memChildren, ChildDirtyMiB: childDirty,
				MemoryMiB: mem, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return writeJSON(out, res)
			}
			fmt.Fprintf(out, "template %s, %s\n", res.Template, res.Accel)
			for _, s := range res.BySize {
				fmt.Fprintf(out, "%5d MiB: fork → first exec p50 %.1f ms %s %.1f ms; parent paused p50 %.1f ms %s %.1f ms; %.1f MiB dirty\n",
					s.MemoryMiB, s.ForkToExec.P50, s.ForkToExec.TailName(), s.ForkToExec.P99, s.ParentPause.P50, s.ParentPause.TailName(), s.ParentPause.P99, s.DirtyMiB)
				fmt.Fprintf(out, "           the child's VMM until its first exec answered: vCPU p50 %.1f ms %s %.1f ms, whole VMM p50 %.1f ms of CPU\n",
					s.ChildVCPU.P50, s.ChildVCPU.TailName(), s.ChildVCPU.P99, s.ChildVMM.P50)
			}
			fmt.Fprintf(out, "spread of fork → exec p50 across sizes: %.1f %%\n", res.SpreadPct)
			fmt.Fprintf(out, "fork(count=%d) all ready: p50 %.1f ms %s %.1f ms\n", res.Fanout.Count, res.Fanout.AllReadyMS.P50, res.Fanout.AllReadyMS.TailName(), res.Fanout.AllReadyMS.P99)
			m := res.Memory
			fmt.Fprintf(out, "%d children dirtying %d MiB each: fork added %.1f MiB PSS (budget %.1f), naive copies %.1f MiB: %.1fx\n",
				m.Children, m.ChildDirtyMiB, m.ForkAddedPSSMiB, m.BudgetMiB, m.NaiveAddedPSSMiB, m.Ratio)
			return nil
		},
	}
	f := cmd.Flags()
	loc.register(f)
	f.StringVar(&tmpl, "template", "base", "template")
	f.StringVar(&sizes, "sizes", "512,1024,2048,4096", "guest RAM sizes (MiB) to compare")
	f.IntVar(&rounds, "rounds", 10, "forks measured per size")
	f.IntVar(&dirty, "dirty", 16, "MiB the parent dirties before it is forked")
	f.IntVar(&fanout, "fanout", 8, "children of the fan-out measurement")
	f.IntVar(&fanRuns, "fanout-runs", 5, "fan-out measurements")
	f.IntVar(&mem, "memory", 1024, "guest RAM (MiB) of the fan-out and memory measurements")
	f.IntVar(&memChildren, "mem-children", 10, "children of the memory measurement")
	f.IntVar(&childDirty, "child-dirty", 8, "MiB each child dirties in the memory measurement")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// localBench holds the flags of benchmarks that run their own host agent
// on DATA_DIR/bench.
type localBench struct{ dataDir, images, accel string }

// benchShape is the template, memory and vCPUs of the sandboxes a local
// benchmark creates (bench create, bench density).
type benchShape struct {
	tmpl       string
	mem, vcpus int
}

func (b *benchShape) register(f *pflag.FlagSet) {
	f.StringVar(&b.tmpl, "template", "base", "template")
	f.IntVar(&b.mem, "memory", 1024, "guest memory in MiB")
	f.IntVar(&b.vcpus, "vcpus", 1, "vCPUs")
}

func (l *localBench) register(f *pflag.FlagSet) {
	f.StringVar(&l.dataDir, "data-dir", envOr("PANDA_DATA_DIR", "/var/lib/pandastack"), "data directory (the benchmark uses DATA_DIR/bench)")
	f.StringVar(&l.images, "images", "", "guest images directory (default DATA_DIR/images)")
	f.StringVar(&l.accel, "accel", "auto", "auto, kvm or tcg")
}

func (l *localBench) imagesDir() string {
	if l.images != "" {
		return l.images
	}
	return filepath.Join(l.dataDir, "images")
}

// agentConfig configures a host agent on DATA_DIR/sub that logs nothing:
// a data directory of its own (next to the server's), so that a running
// server and the benchmark never share sandboxes.
func (l *localBench) agentConfig(sub string) hostagent.Config {
	return hostagent.Config{DataDir: filepath.Join(l.dataDir, sub), ImagesDir: l.imagesDir(), Accel: accel.Accel(l.accel),
		Logger: slog.New(slog.DiscardHandler)}
}

// openAgent opens a host agent as cfg says, with a QEMU driver of its own
// unless cfg has a driver.
func openAgent(ctx context.Context, cfg hostagent.Config) (*hostagent.Agent, error) {
	if cfg.Driver == nil {
		drv, err := qemu.New(qemu.Config{Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("open host agent: %w", err)
		}
		cfg.Driver = drv
	}
	return hostagent.Open(ctx, cfg)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
