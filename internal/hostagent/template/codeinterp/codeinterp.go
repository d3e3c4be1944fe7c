// Package codeinterp is the guest side of the code-interpreter template
// (templates.CodeInterpreter): the code server (server.py, Python 3 with
// the standard library and jupyter_client), what it loads into each
// Python kernel (pandastack_kernel.py: warm imports, the chart and data
// formatters) and its JavaScript driver (node_driver.js), embedded here
// and written into the guest by the template's bake (package template)
// before its start command runs. A change to them changes Hash, which is
// one of the bake's inputs: the template is re-baked, its root filesystem
// (scripts/setup.sh rootfs code-interpreter) is not rebuilt.
//
// The server speaks E2B's code-interpreter protocol, with PandaStack's
// extensions, on port templates.CodeInterpreterPort as user "user"
// (docs/code-interpreter.md, "What runs in the guest").
package codeinterp

import (
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"sync"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

//go:embed guest/server.py guest/pandastack_kernel.py guest/node_driver.js
var guestFS embed.FS

// Where and as whom the server runs in the guest.
const (
	// Dir holds the server's files in the guest; they are root's, so the
	// code the server runs cannot change them.
	Dir = "/opt/pandastack/code"
	// User runs the server and every context (as E2B's template does),
	// in Home.
	User = "user"
	Home = "/home/user"
	// ReadyTimeoutSeconds bounds the bake's wait for /health: the Python
	// context imports numpy, pandas and matplotlib before it answers,
	// which takes about a minute under TCG.
	ReadyTimeoutSeconds = 900
)

// File is one file to write into the guest.
type File struct {
	Path string // absolute, under Dir
	Data []byte
	Mode fs.FileMode
}

var (
	filesOnce sync.Once
	files     []File
	hash      string
)

func load() {
	ents, err := fs.ReadDir(guestFS, "guest")
	if err != nil {
		panic(fmt.Sprintf("codeinterp: embedded files: %v", err)) // the build embeds them
	}
	for _, e := range ents {
		b, err := guestFS.ReadFile("guest/" + e.Name())
		if err != nil {
			panic(fmt.Sprintf("codeinterp: embedded %s: %v", e.Name(), err))
		}
		mode := fs.FileMode(0o644)
		if e.Name() == "server.py" {
			mode = 0o755
		}
		files = append(files, File{Path: path.Join(Dir, e.Name()), Data: b, Mode: mode})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	h := sha256.New()
	for _, f := range files {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f.Data)))
		fmt.Fprintf(h, "%s\x00%o\x00", f.Path, f.Mode)
		h.Write(n[:])
		h.Write(f.Data)
	}
	u := Startup()
	fmt.Fprintf(h, "\x00%s\x00%s", u.StartCmd, u.ReadyCmd)
	hash = hex.EncodeToString(h.Sum(nil))
}

// Files returns the files the bake writes into the guest, by path. The
// caller must not modify them.
func Files() []File {
	filesOnce.Do(load)
	return files
}

// Hash is the content hash of Files and Startup's commands.
func Hash() string {
	filesOnce.Do(load)
	return hash
}

// Startup is what the bake runs once Files are written: the server,
// started detached as User in Home, and its health check, which succeeds
// once every default context (python, javascript, bash) is started and
// warm.
func Startup() templates.Startup {
	return templates.Startup{
		StartCmd:            "exec python3 " + path.Join(Dir, "server.py"),
		ReadyCmd:            fmt.Sprintf("curl -sf --max-time 5 http://127.0.0.1:%d/health >/dev/null", templates.CodeInterpreterPort),
		ReadyTimeoutSeconds: ReadyTimeoutSeconds,
	}
}
