package agent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/guestproto"
)

func testImages() string {
	if d := os.Getenv("PANDA_TEST_IMAGES"); d != "" {
		return d
	}
	return "/var/lib/pandastack/images"
}

func TestSmoke(t *testing.T) {
	dir, _ := os.MkdirTemp("", "pa")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	a, err := Open(ctx, Config{DataDir: dir, ImagesDir: testImages(), Accel: "tcg", VolumeSize: 4 << 30,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		info, err := a.Create(ctx, CreateRequest{Template: "tiny", MemoryMiB: 256, Progress: func(m string) { t.Log(m) }})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		var out bytes.Buffer
		res, err := a.Exec(ctx, info.ID, guestproto.ExecRequest{Shell: "echo hi; uname -a; cat /etc/hostname"}, nil, &out, &out)
		t.Logf("create %v exec %v: %+v %v %q", t1.Sub(t0), time.Since(t1), res, err, out.String())
	}
}
