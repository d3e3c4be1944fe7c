package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/testing/bench"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func benchCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure PandaStack (medians and p99s)"}
	cmd.AddCommand(benchCreateCmd(), benchDensityCmd(), benchAPICmd(), benchForkCmd(), benchLoadCmd(), benchNetCmd(), benchTemplateCmd(), benchExecCmd(), benchClusterCmd(), benchPathCmd(), benchCodeCmd(), benchVolumeCmd())
	return cmd
}

func benchCreateCmd() *cobra.Command {
	var (
		loc            localBench
		shape          benchShape
		n, execs, idle int
		asJSON         bool
	)
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create → first exec latency, exec round trip and idle memory, through the host agent",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			a, err := openAgent(ctx, loc.agentConfig("bench"))
			if err != nil {
				return err
			}
			defer a.Close()
			log := cmd.ErrOrStderr()
			res, err := bench.CreateBench(ctx, a, bench.CreateOptions{
				Template: shape.tmpl, MemoryMiB: shape.mem, VCPUs: shape.vcpus, N: n, Execs: execs, Idle: idle, Log: log,
			})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "template %s, %d MiB, %s\n", res.Template, res.MemoryMiB, res.Accel)
			fmt.Fprintf(out, "create → first exec: p50 %.1f ms  %s %.1f ms  (n=%d)\n", res.Create.P50, res.Create.TailName(), res.Create.P99, res.Create.N)
			fmt.Fprintf(out, "restore (agent ready): p50 %.1f ms  %s %.1f ms\n", res.Restore.P50, res.Restore.TailName(), res.Restore.P99)
			fmt.Fprintf(out, "CPU of the sandbox's VMM until its first exec answered: vCPU p50 %.1f ms  %s %.1f ms, whole VMM p50 %.1f ms\n",
				res.FirstExecVCPU.P50, res.FirstExecVCPU.TailName(), res.FirstExecVCPU.P99, res.FirstExecVMM.P50)
			fmt.Fprintf(out, "exec true: p50 %.1f ms  %s %.1f ms  (n=%d)\n", res.Exec.P50, res.Exec.TailName(), res.Exec.P99, res.Exec.N)
			if res.IdleSandboxes > 0 {
				fmt.Fprintf(out, "idle PSS: %.1f MiB per sandbox (%d sandboxes, private %.1f MiB each)\n",
					res.PSSMiBPerSandbox, res.IdleSandboxes, res.PrivateMiBPerSbx)
			}
			return nil
		},
	}
	f := cmd.Flags()
	loc.register(f)
	shape.register(f)
	f.IntVar(&n, "n", 50, "sequential creates to measure")
	f.IntVar(&execs, "execs", 100, "exec round trips to measure")
	f.IntVar(&idle, "idle", 20, "idle sandboxes whose memory is measured")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func benchAPICmd() *cobra.Command {
	var (
		rem           remoteBench
		tmpl, levels  string
		n, execs, mem int
	)
	cmd := &cobra.Command{
		Use:   "api",
		Short: "Create → first exec, exec round trip and concurrent creates, through the REST API of a running server",
		Long: `Measure a running server through its REST API (the Go SDK), as a client sees it:

  - create → first successful exec of true, sequential (--n times)
  - exec round trip of true in a warm sandbox (--execs times)
  - for each concurrency level c > 1: c creates started at once, the time
    until all of them answered their first exec, and each one's time

Every sandbox it creates is labelled panda_bench=<run id> and killed before
it exits, also on errors and Ctrl-C. It exits non-zero if any create of a
concurrent batch failed.`,
		Example: `  panda bench api --n 50 --concurrency 1,20
  panda bench api --template tiny --memory 256 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conc, err := parseLevels(levels)
			if err != nil {
				return err
			}
			if n < 1 {
				return fmt.Errorf("--n %d: want at least 1", n)
			}
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			res, err := bench.APIBench(cmd.Context(), c, bench.APIOptions{
				Template: tmpl, MemoryMiB: mem, N: n, Execs: execs, Concurrency: conc, Log: cmd.ErrOrStderr(),
			})
			if err != nil && !errors.Is(err, bench.ErrBatchFailed) {
				return err
			}
			if perr := printAPIResult(cmd.OutOrStdout(), res, rem.asJSON); perr != nil {
				return perr
			}
			return err
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "base", "template")
	f.IntVar(&mem, "memory", 1024, "guest memory in MiB")
	f.IntVar(&n, "n", 50, "sequential creates to measure")
	f.IntVar(&execs, "execs", 100, "exec round trips to measure")
	f.StringVar(&levels, "concurrency", "1,20", "comma-separated batch sizes; 1 is the sequential measurement, each c > 1 one batch of c creates at once")
	return cmd
}

// remoteBench holds the flags of benchmarks that measure a running server
// through its REST API (the Go SDK).
type remoteBench struct {
	apiURL, apiKey string
	asJSON         bool
}

func (r *remoteBench) register(f *pflag.FlagSet) {
	f.StringVar(&r.apiURL, "api-url", "", "API URL (default $PANDASTACK_API_URL or "+pandastack.DefaultAPIURL+")")
	f.StringVar(&r.apiKey, "api-key", "", "API key (default $PANDASTACK_API_KEY, else DATA_DIR/admin.key of a local server; DATA_DIR is $PANDA_DATA_DIR or /var/lib/pandastack)")
	f.BoolVar(&r.asJSON, "json", false, "print JSON")
}

// client makes an SDK client the way the CLI does: flags, then the
// environment, then the admin key of a server on this machine; it also
// returns the API key.
func (r *remoteBench) client() (*pandastack.Client, string, error) {
	apiURL, apiKey := r.apiURL, r.apiKey
	if apiURL == "" {
		apiURL = os.Getenv("PANDASTACK_API_URL")
	}
	if apiKey == "" {
		apiKey = os.Getenv("PANDASTACK_API_KEY")
	}
	if apiKey == "" {
		path := filepath.Join(envOr("PANDA_DATA_DIR", "/var/lib/pandastack"), "admin.key")
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, "", fmt.Errorf("no API key: use --api-key or PANDASTACK_API_KEY (cannot read %s: %v)", path, err)
		}
		apiKey = strings.TrimSpace(string(b))
	}
	// Enough idle connections for the largest batch: the benchmark
	// measures the server, not TCP handshakes.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: apiURL, APIKey: apiKey, HTTPClient: hc, UserAgent: "panda-bench"})
	return c, apiKey, err
}

func benchExecCmd() *cobra.Command {
	var (
		rem          remoteBench
		tmpl, e2bDir string
		n, mem, e2bN int
	)
	cmd := &cobra.Command{
		Use:   "exec",
		Short: "Terminal keystroke → echo, background start → first byte and attach → first byte, through the REST API of a running server",
		Long: `Measure interactive latencies of a running server in one sandbox it creates
(labelled panda_bench=<run id> and killed before it exits):

  - keystroke → echo: one key on the terminal WebSocket
    (GET …/processes/{pid}/tty of a cat on a PTY) until its echo comes back
  - background start → first output byte: POST …/processes of echo x, then
    GET …/output until the first byte
  - attach → first output byte: GET …/output?from=start of a process that
    has output
  - exec round trip of true, interleaved: argv [/bin/sh -c true], argv
    [/bin/bash -c true], cmd "true" (a login bash), the same as user
    "user" and with an explicit PATH (left out where the template has no
    bash or no user "user")
  - E2B's JS SDK against PandaStack's Go SDK, in the same run: --e2b-n
    iterations of, in rotating order, (a) the Go SDK's create + exec of
    argv ["true"], (b) the same with argv ["/bin/bash", "-l", "-c", "true"]
    (the command E2B's SDK sends for commands.run('true')), (c) E2B's
    Sandbox.create + commands.run('true') through e2e/e2b/bench.mjs, a
    long-lived Node child (its start-up is not measured). The sandboxes
    of this section have the server's default memory (an E2B create
    cannot choose it) and --template. It runs when node is installed and
    --e2b-dir holds bench.mjs and node_modules/e2b (npm ci); otherwise
    the output says why it was skipped.`,
		Example: `  panda bench exec --template tiny --memory 256 --n 200 --json
  panda bench exec --n 100 --e2b-n 20 --e2b-dir e2e/e2b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n < 1 {
				return fmt.Errorf("--n %d: want at least 1", n)
			}
			c, key, err := rem.client()
			if err != nil {
				return err
			}
			res, err := bench.ExecBench(cmd.Context(), c, bench.ExecOptions{
				Template: tmpl, MemoryMiB: mem, APIKey: key, N: n, Log: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if e2bN > 0 {
				e, err := benchE2B(cmd, c, key, tmpl, e2bDir, e2bN)
				if err != nil {
					return err
				}
				res.E2B = &e
			}
			out := cmd.OutOrStdout()
			if rem.asJSON {
				return writeJSON(out, res)
			}
			printExecResult(out, res)
			return nil
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "base", "template")
	f.IntVar(&mem, "memory", 1024, "guest memory in MiB")
	f.IntVar(&n, "n", 100, "measurements of each kind")
	f.IntVar(&e2bN, "e2b-n", 20, "iterations of the E2B SDK comparison (0: skip it)")
	f.StringVar(&e2bDir, "e2b-dir", "", "the e2b package directory holding bench.mjs and node_modules (default e2e/e2b under the working directory, else next to the panda binary's directory)")
	return cmd
}

// benchE2B runs the E2B section of `panda bench exec`, or reports in its
// result why it was skipped.
func benchE2B(cmd *cobra.Command, c *pandastack.Client, key, tmpl, dir string, n int) (bench.E2BResult, error) {
	node, _ := exec.LookPath("node")
	if dir == "" {
		dir = "e2e/e2b"
		if exe, err := os.Executable(); err == nil {
			if d := filepath.Join(filepath.Dir(exe), "..", "e2e", "e2b"); bench.E2BMissing(node, dir) != "" && bench.E2BMissing(node, d) == "" {
				dir = d
			}
		}
	}
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	if why := bench.E2BMissing(node, dir); why != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "skipping the E2B SDK comparison: %s\n", why)
		return bench.E2BResult{Skipped: why}, nil
	}
	return bench.E2BBench(cmd.Context(), c, bench.E2BOptions{
		Template: tmpl, N: n, Node: node, Dir: dir, APIURL: c.APIURL(), APIKey: key, Log: cmd.ErrOrStderr(),
	})
}

func printExecResult(out io.Writer, res bench.ExecResult) {
	fmt.Fprintf(out, "server %s, template %s, %d MiB\n", res.APIURL, res.Template, res.MemoryMiB)
	for _, l := range []struct {
		name string
		d    bench.Dist
	}{{"keystroke → echo (WebSocket):", res.KeystrokeEcho}, {"background start → first byte:", res.StartToFirstByte}, {"attach → first byte:", res.AttachToFirstByte}} {
		fmt.Fprintf(out, "%-31s p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", l.name, l.d.P50, l.d.TailName(), l.d.P99, l.d.N)
	}
	if len(res.Shells) > 0 {
		fmt.Fprintln(out, "exec round trip, interleaved:")
	}
	for _, d := range res.Shells {
		fmt.Fprintf(out, "  %-29s p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", d.Name, d.P50, bench.TailName(d.N), d.P99, d.N)
	}
	e := res.E2B
	if e == nil {
		return
	}
	if e.Skipped != "" {
		fmt.Fprintf(out, "E2B SDK comparison: skipped: %s\n", e.Skipped)
		return
	}
	fmt.Fprintf(out, "E2B SDK %s vs PandaStack Go SDK, create → first true, alternating (template %s, %d MiB):\n", e.SDKVersion, e.Template, e.MemoryMiB)
	for _, l := range []struct {
		name string
		d    bench.Dist
	}{
		{"e2b Sandbox.create + commands.run('true') [bash -l -c true]:", e.E2B},
		{"pandastack Create + Exec argv [true]:", e.PandaStack},
		{"pandastack Create + Exec argv [/bin/bash -l -c true]:", e.PandaStackLogin},
	} {
		fmt.Fprintf(out, "  %-60s p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", l.name, l.d.P50, l.d.TailName(), l.d.P99, l.d.N)
	}
	fmt.Fprintf(out, "  ratio e2b/pandastack at p50, each SDK's own command:        %.3f\n", e.Ratio)
	fmt.Fprintf(out, "  ratio e2b/pandastack at p50, same command (bash -l -c true): %.3f  (protocol overhead; target ≤ 1.15)\n", e.RatioLogin)
}

func parseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("--concurrency %q: want positive integers separated by commas", s)
		}
		out = append(out, v)
	}
	return out, nil
}

func printAPIResult(out io.Writer, res bench.APIResult, asJSON bool) error {
	if asJSON {
		return writeJSON(out, res)
	}
	fmt.Fprintf(out, "server %s, template %s, %d MiB\n", res.APIURL, res.Template, res.MemoryMiB)
	d := res.CreateToFirstExec
	fmt.Fprintf(out, "create → first exec:  p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", d.P50, d.TailName(), d.P99, d.N)
	d = res.Create
	fmt.Fprintf(out, "create request alone: p50 %7.1f ms  %s %7.1f ms\n", d.P50, d.TailName(), d.P99)
	d = res.Exec
	fmt.Fprintf(out, "exec true:            p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", d.P50, d.TailName(), d.P99, d.N)
	for _, c := range res.Concurrent {
		fmt.Fprintf(out, "%d concurrent creates: all ready in %.1f ms; each p50 %.1f ms  %s %.1f ms; %d ok, %d failed\n",
			c.Concurrency, c.AllReadyMS, c.P50MS, bench.TailName(c.OK), c.P99MS, c.OK, c.Failed)
		for _, e := range c.Errors {
			fmt.Fprintf(out, "  failed: %s\n", e)
		}
	}
	return nil
}

func benchLoadCmd() *cobra.Command {
	var (
		rem                            remoteBench
		tmpl                           string
		creates, bigExecs, bigMiB, mem int
		pid                            int
	)
	cmd := &cobra.Command{
		Use:   "load",
		Short: "Many creates at once, then many large buffered execs at once, against a running server",
		Long: `Load a running server through its REST API (the Go SDK):

  - --creates creates started at once, each followed by its first exec: on a
    small machine they queue, and none may fail or time out;
  - then --big-execs buffered execs at once in those sandboxes, each printing
    --big-exec-mib MiB, while the server's peak memory (VmHWM, reset first) is
    measured (--pid, default: the process listening on the API's port, when
    it runs on this machine).

The API key needs a sandbox quota of at least --creates. Every sandbox it
creates is labelled panda_bench=<run id> and killed before it exits. It exits
non-zero if any operation failed.`,
		Example: `  panda bench load --template tiny --memory 256
  panda bench load --creates 100 --big-execs 20 --big-exec-mib 16 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			if pid == 0 {
				pid = listenerPID(c.APIURL())
			}
			res, err := bench.LoadBench(cmd.Context(), c, bench.LoadOptions{
				Template: tmpl, MemoryMiB: mem, Creates: creates, BigExecs: bigExecs, BigExecMiB: bigMiB,
				ServerPID: pid, Log: cmd.ErrOrStderr(),
			})
			if err != nil && !errors.Is(err, bench.ErrLoadFailed) {
				return err
			}
			if rem.asJSON {
				if perr := writeJSON(cmd.OutOrStdout(), res); perr != nil {
					return perr
				}
				return err
			}
			out := cmd.OutOrStdout()
			cr := res.Creates
			fmt.Fprintf(out, "%d creates at once: %d ok, %d failed; all ready in %.1f s; per sandbox p50 %.0f ms %s %.0f ms\n",
				cr.Concurrency, cr.OK, cr.Failed, cr.AllReadyMS/1000, cr.P50MS, bench.TailName(cr.OK), cr.P99MS)
			for _, e := range cr.Errors {
				fmt.Fprintf(out, "  create failed: %s\n", e)
			}
			fmt.Fprintf(out, "%d buffered execs of %d MiB at once: %d ok; answered p50 %.0f ms %s %.0f ms\n",
				bigExecs, res.BigExecMiB, res.BigExecsOK, res.BigExecs.P50, res.BigExecs.TailName(), res.BigExecs.P99)
			for _, e := range res.BigExecErrs {
				fmt.Fprintf(out, "  exec failed: %s\n", e)
			}
			if res.ServerRSSPeakMiB > 0 {
				fmt.Fprintf(out, "server memory: %.0f MiB before, peak %.0f MiB during the large execs\n", res.ServerRSSBeforeMiB, res.ServerRSSPeakMiB)
			}
			return err
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&tmpl, "template", "", "template (default: the server's)")
	f.IntVar(&mem, "memory", 0, "guest memory in MiB (default: the server's)")
	f.IntVar(&creates, "creates", 100, "creates started at once")
	f.IntVar(&bigExecs, "big-execs", 20, "large buffered execs run at once")
	f.IntVar(&bigMiB, "big-exec-mib", 16, "output of each large exec, MiB")
	f.IntVar(&pid, "pid", 0, "server process to measure (default: the one listening on the API's port)")
	return cmd
}

// listenerPID returns the PID of the local process listening on the port of
// apiURL, or 0: found through /proc/net/tcp and the sockets in /proc/*/fd.
func listenerPID(apiURL string) int {
	u, err := url.Parse(apiURL)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return 0
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// local_address is hex ip:port; state 0A is LISTEN.
			if len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			if _, p, ok := strings.Cut(fs[1], ":"); ok {
				if v, err := strconv.ParseInt(p, 16, 32); err == nil && int(v) == port {
					inodes["socket:["+fs[9]+"]"] = true
				}
			}
		}
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && inodes[target] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

func benchTemplateCmd() *cobra.Command {
	var (
		rem        remoteBench
		from, file string
		n, mem     int
	)
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Dockerfile build, rebuild after a change to its last step, and creates from the built template vs its FROM, through a running server",
		Long: `Measure template builds through the REST API of a running server:

  - a cold build of a Dockerfile (by default FROM base with three RUN steps
    of a few seconds each under TCG, and no network; --file for your own,
    whose last line must be a RUN step)
  - the same build with only its last step changed: the steps before it
    come from the layer cache (target: at most 25 % of the cold build)
  - create → first exec of sandboxes from the built template and from its
    FROM, alternately, --n each (target: within 10 %)

The template (bench-<run id>) and every sandbox are removed before it
exits, also on errors and Ctrl-C.`,
		Example: `  panda bench template
  panda bench template --n 20 --json
  panda bench template --file ./Dockerfile`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := rem.client()
			if err != nil {
				return err
			}
			o := bench.TemplateOptions{From: from, MemoryMiB: mem, N: n, Log: cmd.ErrOrStderr()}
			if file != "" {
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				o.Dockerfile = string(b)
			}
			res, err := bench.TemplateBench(cmd.Context(), c, o)
			if err != nil {
				return err
			}
			if rem.asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "server %s, FROM %s\n", res.APIURL, res.From)
			fmt.Fprintf(out, "cold build:               %7.1f s\n", res.ColdBuildS)
			fmt.Fprintf(out, "rebuild, last step changed: %5.1f s  (%.2f of the cold build; %d steps cached)\n", res.RebuildS, res.RebuildRatio, res.CachedSteps)
			fmt.Fprintf(out, "first create (bakes it):  %7.1f s\n", res.FirstCreateS)
			d, f := res.CreateBuilt, res.CreateFrom
			fmt.Fprintf(out, "create → first exec, built: p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", d.P50, d.TailName(), d.P99, d.N)
			fmt.Fprintf(out, "create → first exec, FROM:  p50 %7.1f ms  %s %7.1f ms  (n=%d)\n", f.P50, f.TailName(), f.P99, f.N)
			fmt.Fprintf(out, "ratio built/FROM at p50:    %.2f\n", res.CreateRatio)
			return nil
		},
	}
	f := cmd.Flags()
	rem.register(f)
	f.StringVar(&from, "from", "base", "FROM of the default Dockerfile: base, tiny or an image reference")
	f.StringVar(&file, "file", "", "a Dockerfile of your own to build instead (its last line must be a RUN step)")
	f.IntVar(&mem, "memory", 0, "guest memory in MiB of the sandboxes measured (0: the server's default)")
	f.IntVar(&n, "n", 10, "creates measured per template")
	return cmd
}
