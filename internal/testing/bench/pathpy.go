package bench

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

//go:embed pathdriver.py
var pathDriver string

// PythonSDK is the Python SDK's leg of PathBench: a python3 process that
// drives the SDK (import pandastack from SDKDir) against the same API,
// request by request (pathdriver.py). Its times are measured inside that
// process, so they hold the SDK's own costs and nothing of the pipe.
type PythonSDK struct {
	SDKDir string // the directory holding the pandastack package (sdk/python/src)
	APIURL string
	APIKey string

	child *lineChild
}

// FindPythonSDK is the directory of the Python SDK's package for
// `panda bench path`: dir if given (an error if it holds no pandastack
// package), else sdk/python/src under the working directory or above the
// running binary's directory (bin/panda in a checkout), else "" (no
// Python leg). python3 must be on PATH.
func FindPythonSDK(dir string) (string, error) {
	has := func(d string) bool {
		_, err := os.Stat(filepath.Join(d, "pandastack", "__init__.py"))
		return err == nil
	}
	if dir != "" {
		if !has(dir) {
			return "", fmt.Errorf("--python-sdk %s: no pandastack package there (give the repository's sdk/python/src)", dir)
		}
		if _, err := exec.LookPath("python3"); err != nil {
			return "", fmt.Errorf("--python-sdk: python3 is not on PATH")
		}
		return dir, nil
	}
	if _, err := exec.LookPath("python3"); err != nil {
		return "", nil
	}
	cands := []string{filepath.Join("sdk", "python", "src")}
	if exe, err := os.Executable(); err == nil {
		cands = append(cands, filepath.Join(filepath.Dir(exe), "..", "sdk", "python", "src"))
	}
	for _, d := range cands {
		if has(d) {
			return filepath.Abs(d)
		}
	}
	return "", nil
}

// start runs the driver for sandboxes of o's shape.
func (p *PythonSDK) start(ctx context.Context, o PathOptions) error {
	opts, _ := json.Marshal(map[string]any{"template": o.Template, "memory_mib": o.MemoryMiB, "vcpus": o.VCPUs})
	env := append(os.Environ(), "PYTHONPATH="+p.SDKDir, "PANDASTACK_API_URL="+p.APIURL, "PANDASTACK_API_KEY="+p.APIKey,
		"PYTHONDONTWRITEBYTECODE=1")
	c, err := startLineChild(ctx, "", env, "python3", "-u", "-c", pathDriver, string(opts))
	if err != nil {
		return fmt.Errorf("python SDK leg: %w", err)
	}
	c.name = "the Python SDK's driver"
	p.child = c
	return nil
}

// call sends one request and returns the time the driver measured.
func (p *PythonSDK) call(req map[string]string) (time.Duration, error) {
	line, _ := json.Marshal(req)
	b, err := p.child.send(string(line))
	if err != nil {
		return 0, err
	}
	var res struct {
		MS    float64 `json:"ms"`
		Error string  `json:"error"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return 0, fmt.Errorf("the Python SDK's driver: %w: %q", err, b)
	}
	if res.Error != "" {
		return 0, errors.New("python SDK: " + res.Error)
	}
	return time.Duration(res.MS * float64(time.Millisecond)), nil
}

// stop ends the driver.
func (p *PythonSDK) stop() {
	if p.child != nil {
		p.child.stop()
	}
}
