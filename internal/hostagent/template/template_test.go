package template

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// copyImages makes a private copy of the guest images that the test may
// change.
func copyImages(t *testing.T) Images {
	t.Helper()
	src := Images{Dir: testkit.Images()}
	dst := Images{Dir: t.TempDir()}
	os.MkdirAll(filepath.Dir(dst.Kernel()), 0o755)
	for _, f := range [][2]string{{src.Kernel(), dst.Kernel()}, {src.Initramfs(), dst.Initramfs()}, {src.Agent(), dst.Agent()}} {
		in, err := os.Open(f[0])
		if err != nil {
			t.Fatalf("guest images missing (run make setup): %v", err)
		}
		out, _ := os.Create(f[1])
		io.Copy(out, in)
		in.Close()
		out.Close()
	}
	if err := copySparse(src.RootFS("tiny"), dst.RootFS("tiny")); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestStaleTemplateIsRebaked(t *testing.T) {
	testkit.VM(t)
	images := copyImages(t)
	drv, err := qemu.New(qemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", "pt") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	st, err := NewStore(Config{Dir: filepath.Join(t.TempDir(), "templates"), RunDir: run, Images: images, Driver: drv, Accel: accel.TCG, TSCkHz: qemu.TSCkHz()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1}

	if _, reason, err := st.Lookup(p); err != nil || reason != "not baked yet" {
		t.Fatalf("Lookup before bake: %q, %v", reason, err)
	}
	var progress []string
	fds := testkit.OpenFDs(t)
	first, err := st.Get(ctx, p, func(m string) { progress = append(progress, m) })
	if err != nil {
		t.Fatal(err)
	}
	if len(progress) < 3 || first.BootID == "" || len(first.Inputs) != 4 {
		t.Errorf("bake: progress %q, meta %+v", progress, first.Meta)
	}
	// Baked with a network interface (the default: an isolated TAP),
	// which every restore must have too; the bake left no descriptor
	// (hence no TAP and no namespace) behind.
	if spec := first.Spec(images); first.MAC != guestnet.GuestMAC || spec.Net == nil || spec.Net.MAC != guestnet.GuestMAC || spec.Net.TAP != nil {
		t.Errorf("template MAC %q, spec Net %+v; want %s and no TAP", first.MAC, spec.Net, guestnet.GuestMAC)
	}
	if got := testkit.OpenFDs(t); got != fds {
		t.Errorf("%d descriptors open after the bake, %d before", got, fds)
	}
	for _, f := range []string{first.MemFile(), first.StateFile(), first.RootFS()} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("baked template lacks %s", f)
		}
	}
	again, err := st.Get(ctx, p, nil)
	if err != nil || !again.BakedAt.Equal(first.BakedAt) {
		t.Errorf("a fresh template was baked again: %v %v", again.BakedAt, err)
	}

	// A new guest agent makes the template stale: Get must re-bake it.
	f, _ := os.OpenFile(images.Agent(), os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte{0})
	f.Close()
	if _, reason, _ := st.Lookup(p); !strings.Contains(reason, "agent changed") {
		t.Errorf("Lookup after the agent changed: reason %q", reason)
	}
	second, err := st.Get(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !second.BakedAt.After(first.BakedAt) || second.Inputs["agent"] == first.Inputs["agent"] {
		t.Errorf("stale template not re-baked: %v → %v", first.BakedAt, second.BakedAt)
	}
	if _, reason, _ := st.Lookup(p); reason != "" {
		t.Errorf("after the re-bake: stale %q", reason)
	}

	// So does a new initramfs (new guest modules, a new /init).
	f, _ = os.OpenFile(images.Initramfs(), os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte{0})
	f.Close()
	if _, reason, _ := st.Lookup(p); !strings.Contains(reason, "initramfs changed") {
		t.Errorf("Lookup after the initramfs changed: reason %q", reason)
	}
}

// TestBakeNetHook: a bake gets its NIC from Config.Net, says what for, and
// releases it once, after its machine exited; a hook's failure fails the
// bake before any machine starts. A template without a NIC is stale.
func TestBakeNetHook(t *testing.T) {
	testkit.VM(t)
	images := copyImages(t)
	drv, err := qemu.New(qemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", "pt")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(run)
	var mu sync.Mutex
	var purposes []string
	released := 0
	var hookErr error
	cfg := Config{Dir: filepath.Join(t.TempDir(), "templates"), RunDir: run, Images: images, Driver: drv, Accel: accel.TCG, TSCkHz: qemu.TSCkHz(),
		Net: func(ctx context.Context, purpose string) (*vmm.Net, func(), error) {
			mu.Lock()
			defer mu.Unlock()
			purposes = append(purposes, purpose)
			if hookErr != nil {
				return nil, nil, hookErr
			}
			nic, release, err := guestnet.IsolatedNIC(ctx, purpose)
			if err != nil {
				return nil, nil, err
			}
			tap := nic.TAP
			return nic, func() {
				// The machine is gone: nothing but this descriptor holds
				// the TAP, whose namespace then has one user left.
				if _, err := tap.Stat(); err != nil {
					t.Errorf("TAP closed before its release: %v", err)
				} else if pids := testkit.Procs("guest=panda:" + run + "/"); len(pids) != 0 {
					t.Errorf("VMM %v of the bake still runs at the release of its TAP", pids)
				}
				mu.Lock()
				released++
				mu.Unlock()
				release()
			}, nil
		}}
	st, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1}
	tp, err := st.Get(ctx, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(purposes) == 0 || purposes[0] != "bake tiny-256m-1c" || released != len(purposes) {
		t.Errorf("hook called for %q, released %d times; want \"bake tiny-256m-1c\", each released", purposes, released)
	}
	hookErr = errors.New("no namespace left")
	purposes = nil
	mu.Unlock()
	if _, err := st.Bake(ctx, p, nil); err == nil || !strings.Contains(err.Error(), "no namespace left") {
		t.Errorf("bake with a failing hook: %v", err)
	}

	// A template baked before guests had a NIC is stale.
	meta := filepath.Join(tp.Dir, metaFile)
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, []byte(strings.Replace(string(b), `"mac": "`+guestnet.GuestMAC+`"`, `"mac": ""`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, reason, _ := st.Lookup(p); !strings.Contains(reason, "without the guests' network interface") {
		t.Errorf("Lookup of a template without a NIC: reason %q", reason)
	}

	// It was baked on the current device layout, which its restores get
	// back; one baked on the PIT's layout is stale.
	if tp.Machine != vmm.MachineCurrent || tp.Spec(images).Machine != vmm.MachineCurrent {
		t.Errorf("template machine %q, restore spec machine %q; want %q", tp.Machine, tp.Spec(images).Machine, vmm.MachineCurrent)
	}
	legacy := strings.Replace(string(b), `"machine": "`+vmm.MachineCurrent+`"`, `"machine": ""`, 1)
	if legacy == string(b) {
		t.Fatalf("template.json records no machine layout:\n%s", b)
	}
	if err := os.WriteFile(meta, []byte(legacy), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, reason, _ := st.Lookup(p); reason != "machine layout changed" {
		t.Errorf("Lookup of a template of the legacy layout: reason %q", reason)
	}
}

func TestUnknownTemplate(t *testing.T) {
	testkit.VM(t)
	st, err := NewStore(Config{Dir: t.TempDir(), Images: Images{Dir: testkit.Images()}, Accel: accel.TCG})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Get(context.Background(), templates.Params{Name: "nosuch", MemoryMiB: 256, VCPUs: 1}, nil)
	if !errors.Is(err, templates.ErrNotFound) || !strings.Contains(err.Error(), "tiny") {
		t.Errorf("got %v, want templates.ErrNotFound listing the available templates", err)
	}
	for _, p := range []templates.Params{{Name: "Bad", MemoryMiB: 256, VCPUs: 1}, {Name: "tiny", MemoryMiB: 1, VCPUs: 1}, {Name: "tiny", MemoryMiB: 256, VCPUs: 0}} {
		if _, err := st.Get(context.Background(), p, nil); !errors.Is(err, templates.ErrInvalid) {
			t.Errorf("Get(%+v): %v, want templates.ErrInvalid", p, err)
		}
	}
}

func TestSparseHashAndCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.Truncate(64 << 20)
	f.WriteAt([]byte("hello"), 10<<20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	h1, _ := sparseHash(src)
	h2, _ := sparseHash(dst)
	if h1 != h2 {
		t.Errorf("copy hashes differently: %s vs %s", h1, h2)
	}
	b := make([]byte, 5)
	g, _ := os.Open(dst)
	g.ReadAt(b, 10<<20)
	g.Close()
	if string(b) != "hello" {
		t.Errorf("copy lost data: %q", b)
	}
	os.WriteFile(src, []byte("x"), 0o644)
	if h3, _ := sparseHash(src); h3 == h1 {
		t.Errorf("hash did not change with the content")
	}
}
