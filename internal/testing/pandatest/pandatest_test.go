package pandatest

// These tests run a fake panda: this test binary again, with PANDATEST_FAKE
// set to how it should behave. The real one is tested by the suites that
// use this package.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("PANDATEST_FAKE"); mode != "" {
		os.Exit(fakePanda(mode, os.Args[1:]))
	}
	os.Exit(Main(m))
}

// fakePanda serves GET /healthz like `panda up|server|agent`: it writes
// its arguments to DATA_DIR/argv, the admin key (not as an agent) and a
// banner to stdout, a log line to stderr, and exits at SIGTERM. mode is
// "ok" (exit 0 at SIGTERM), "exit3" (exit 3 at SIGTERM) or "die" (exit 1
// at once); "sleep" only sleeps, as a fake QEMU.
func fakePanda(mode string, args []string) int {
	if mode == "sleep" {
		time.Sleep(10 * time.Minute)
		return 0
	}
	fs := flag.NewFlagSet("panda", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "")
	listen := fs.String("listen", "", "")
	fs.String("images", "", "")
	fs.String("accel", "", "")
	fs.String("network", "", "")
	fs.String("extra", "", "")
	if len(args) == 0 || fs.Parse(args[1:]) != nil {
		return 2
	}
	fmt.Fprintln(os.Stderr, "fake panda: starting")
	if mode == "die" {
		fmt.Fprintln(os.Stderr, "fake panda: boom")
		return 1
	}
	if err := os.WriteFile(filepath.Join(*dataDir, "argv"), []byte(strings.Join(args, "\n")), 0o600); err != nil {
		return 1
	}
	if args[0] != "agent" {
		if err := os.WriteFile(filepath.Join(*dataDir, "admin.key"), []byte("panda_fake\n"), 0o600); err != nil {
			return 1
		}
		fmt.Println("Created the admin API key: panda_fake")
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if args[0] == "agent" {
		// As the real one: TLS, with its CA in DATA_DIR/agent-ca.pem.
		cfg, err := fakeAgentTLS(*dataDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		l = tls.NewListener(l, cfg)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	<-term
	if mode == "exit3" {
		return 3
	}
	return 0
}

// fakeAgentTLS makes a self-signed certificate for 127.0.0.1, written to
// dir/agent-ca.pem.
func fakeAgentTLS(dir string) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake agent"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "agent-ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}, nil
}

// startFake starts the fake panda in mode.
func startFake(t *testing.T, mode string, opts Options) *Server {
	t.Helper()
	t.Setenv("PANDATEST_FAKE", mode)
	opts.Bin = os.Args[0]
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

func TestStartStop(t *testing.T) {
	tests := []struct {
		command  string
		wantArgs string
		wantKey  string
	}{
		{"", "up --data-dir D --listen A --images I --accel tcg --network off --extra x", "panda_fake"},
		{"agent", "agent --data-dir D --listen A --images I --accel tcg --network off --extra x", ""},
		{"server", "server --data-dir D --listen A --extra x", "panda_fake"},
	}
	for _, tt := range tests {
		t.Run(tt.command, func(t *testing.T) {
			s := startFake(t, "ok", Options{Command: tt.command, Images: "I", Args: []string{"--extra", "x"}})
			dir := s.DataDir()
			if len(dir) > len(os.TempDir())+16 {
				t.Errorf("data directory %s: want a short name", dir)
			}
			b, err := os.ReadFile(filepath.Join(dir, "argv"))
			if err != nil {
				t.Fatal(err)
			}
			addr := strings.TrimPrefix(strings.TrimPrefix(s.URL(), "http://"), "https://")
			if want := map[bool]string{true: "https://", false: "http://"}[tt.command == "agent"]; !strings.HasPrefix(s.URL(), want) {
				t.Errorf("URL %s: want %s", s.URL(), want)
			}
			got := strings.NewReplacer(dir, "D", addr, "A").Replace(strings.ReplaceAll(string(b), "\n", " "))
			if got != tt.wantArgs {
				t.Errorf("got arguments %q, want %q", got, tt.wantArgs)
			}
			if s.AdminKey() != tt.wantKey {
				t.Errorf("got admin key %q, want %q", s.AdminKey(), tt.wantKey)
			}
			if !s.Healthy() || s.PID() <= 0 {
				t.Errorf("Healthy() %v, PID() %d: want true and a PID", s.Healthy(), s.PID())
			}
			if tt.wantKey != "" && !strings.Contains(s.Stdout(), "Created the admin API key") {
				t.Errorf("got stdout %q, want the banner", s.Stdout())
			}
			if !strings.Contains(s.Log(), "fake panda: starting") {
				t.Errorf("got log %q, want what it wrote to stderr", s.Log())
			}
			if err := s.Stop(); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if testkit.Alive(s.PID()) {
				t.Errorf("process %d alive after Stop", s.PID())
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("data directory after Stop: got %v, want it removed", err)
			}
			if err := s.Stop(); err != nil {
				t.Errorf("second Stop: got %v, want nil", err)
			}
		})
	}
}

func TestStopReportsExitStatus(t *testing.T) {
	s := startFake(t, "exit3", Options{})
	if err := s.Stop(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop: got %v, want an error with exit status 3", err)
	}
}

func TestKillKeepsDataDir(t *testing.T) {
	dir := t.TempDir()
	s := startFake(t, "exit3", Options{DataDir: dir})
	s.Kill()
	if testkit.Alive(s.PID()) || s.Healthy() {
		t.Fatalf("process %d alive after Kill", s.PID())
	}
	if err := s.Stop(); err != nil {
		t.Errorf("Stop after Kill: got %v, want nil", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "admin.key")); err != nil {
		t.Errorf("the caller's data directory after Kill and Stop: %v", err)
	}
}

func TestStartFails(t *testing.T) {
	t.Setenv("PANDATEST_FAKE", "die")
	s, err := Start(Options{Bin: os.Args[0], DataDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "fake panda: boom") {
		t.Errorf("Start: got %v, %v; want an error with the process's output", s, err)
	}
}

func TestCommandErrors(t *testing.T) {
	if _, err := Command(t.Context(), Options{Bin: "/bin/true"}); err == nil {
		t.Error("Command without a data directory: got no error")
	}
	if _, err := Command(t.Context(), Options{Bin: "/bin/true", DataDir: "/d", Command: "bake"}); err == nil {
		t.Error("Command bake: got no error")
	}
}

// runner is a fake *testing.M.
type runner int

func (r runner) Run() int { return int(r) }

func TestMainStopsServers(t *testing.T) {
	ok := startFake(t, "ok", Options{})
	if code := Main(runner(0)); code != 0 {
		t.Errorf("Main after a clean stop: got %d, want 0", code)
	}
	if ok.Healthy() {
		t.Error("the server is healthy after Main")
	}
	startFake(t, "exit3", Options{})
	if code := Main(runner(0)); code != 1 {
		t.Errorf("Main after a stop with exit status 3: got %d, want 1", code)
	}
	if code := Main(runner(2)); code != 2 {
		t.Errorf("Main of failed tests: got %d, want 2", code)
	}
}

func TestRemoveDataDir(t *testing.T) {
	testkit.Root(t) // mounts
	dir, err := os.MkdirTemp("", "pt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Unmount(filepath.Join(dir, "store"), syscall.MNT_DETACH)
		os.RemoveAll(dir)
	})
	// A mount and a "QEMU" (a copy of this binary, sleeping) left behind.
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", store, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	if !testkit.Mounted(store) {
		t.Fatalf("testkit.Mounted(%s) = false after mounting it", store)
	}
	qemu := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	copyFile(t, os.Args[0], qemu)
	cmd := exec.Command(qemu, "-drive", dir+"/disk")
	cmd.Env = append(os.Environ(), "PANDATEST_FAKE=sleep")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	t.Cleanup(func() { cmd.Process.Kill() })
	testkit.Poll(10*time.Second, func() bool { return len(testkit.QEMUProcs(dir)) > 0 })
	if got := testkit.QEMUProcs(dir); len(got) != 1 || got[0] != cmd.Process.Pid {
		t.Fatalf("QEMUProcs: got %v, want [%d]", got, cmd.Process.Pid)
	}

	left, err := RemoveDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || !strings.Contains(left[0], "QEMU processes") || !strings.Contains(left[1], store+" mounted (unmounted)") {
		t.Errorf("got leftovers %q, want the QEMU process and the mount", left)
	}
	if testkit.Alive(cmd.Process.Pid) || testkit.Mounted(store) {
		t.Errorf("after RemoveDataDir: QEMU alive %v, store mounted %v; want neither", testkit.Alive(cmd.Process.Pid), testkit.Mounted(store))
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after RemoveDataDir: got %v, want it removed", dir, err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestTailBuffer(t *testing.T) {
	var b tailBuffer
	for i := range 3 * tailMax / 10 {
		fmt.Fprintf(&b, "%09d\n", i)
	}
	got := b.Tail(20)
	if want := fmt.Sprintf("...%09d\n%09d\n", 3*tailMax/10-2, 3*tailMax/10-1); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if len(b.b) > 2*tailMax {
		t.Errorf("holds %d bytes, want at most %d", len(b.b), 2*tailMax)
	}
	var short tailBuffer
	short.Write([]byte("abc"))
	if got := short.Tail(20); got != "abc" {
		t.Errorf("got %q, want abc", got)
	}
}

func TestProblemLines(t *testing.T) {
	var p problemLines
	// Lines arrive split across writes, as a pipe delivers them.
	for _, chunk := range []string{
		"time=1 level=INFO msg=ok\ntime=2 level=WA",
		"RN msg=\"slow disk\"\n",
		`{"time":"3","level":"ERROR","msg":"resume failed"}` + "\n",
		"level=ERROR without its newline yet",
	} {
		p.Write([]byte(chunk))
	}
	want := []string{`time=2 level=WARN msg="slow disk"`, `{"time":"3","level":"ERROR","msg":"resume failed"}`}
	if got := p.Lines(); !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	for i := range problemMax + 5 {
		fmt.Fprintf(&p, "\nlevel=ERROR n=%d %s\n", i, strings.Repeat("x", problemLineMax))
	}
	got := p.Lines()
	if len(got) != problemMax {
		t.Fatalf("kept %d lines, want %d", len(got), problemMax)
	}
	if !strings.HasPrefix(got[len(got)-1], fmt.Sprintf("level=ERROR n=%d ", problemMax+4)) || len(got[0]) > problemLineMax+len("…") {
		t.Errorf("kept %q … %q: want the last lines, each cut at %d bytes", got[0][:30], got[len(got)-1][:30], problemLineMax)
	}
}

// DialerIn reaches a server that listens inside another network namespace,
// which the test's own namespace cannot reach.
func TestDialerIn(t *testing.T) {
	testkit.Root(t) // network namespaces
	name := fmt.Sprintf("ptdial%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("lo up: %v: %s", err, out)
	}
	// A server inside the namespace: nc would do, but python3 is at hand.
	srv := exec.Command("nsenter", "--net=/run/netns/"+name, "python3", "-c",
		"import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('127.0.0.1', 47123)); s.listen(1); print('ready', flush=True)\nc,_=s.accept(); c.sendall(b'hello from inside'); c.close()")
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("server in the namespace: %q, %v", line, err)
	}
	// Not from here: this namespace's 127.0.0.1:47123 has no listener.
	if c, err := net.Dial("tcp", "127.0.0.1:47123"); err == nil {
		c.Close()
		t.Fatal("the test's own namespace reached a server inside another one")
	}
	c, err := DialerIn("/run/netns/"+name)(context.Background(), "tcp", "127.0.0.1:47123")
	if err != nil {
		t.Fatalf("DialerIn: %v", err)
	}
	defer c.Close()
	b, _ := io.ReadAll(c)
	if string(b) != "hello from inside" {
		t.Errorf("read %q", b)
	}
	// The calling thread is back in its namespace: dialing here fails again.
	if c, err := net.Dial("tcp", "127.0.0.1:47123"); err == nil {
		c.Close()
		t.Error("after DialerIn, a plain dial reached the other namespace")
	}
}
