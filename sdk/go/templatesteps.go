package pandastack

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// TemplateSteps is a Dockerfile written in code: FROM an image, then
// steps (Run, Copy, Env, Workdir, User), built with
// Client.BuildTemplateSteps. Each method adds a step and returns t; the
// first invalid step's error is returned by Dockerfile and by the build.
//
//	steps := pandastack.FromImage("registry.example.com/python:3.12").
//		Run("pip install flask").
//		Copy("./app", "/srv/app").
//		Env("FLASK_APP", "app").
//		Workdir("/srv/app")
//	b, err := c.BuildTemplateSteps(ctx, "flask", steps, nil,
//		pandastack.WithStartCmd("flask run --port 8000"))
type TemplateSteps struct {
	from   string
	lines  []string
	copies []stepCopy
	err    error
}

type stepCopy struct{ src, name string }

var (
	stepUserRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$`)
	envNameRE  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// FromImage starts steps FROM image ref: a registry reference, or base or
// tiny (the server's built-in root filesystems).
func FromImage(ref string) *TemplateSteps {
	t := &TemplateSteps{from: ref}
	if strings.TrimSpace(ref) == "" || strings.ContainsAny(ref, " \t\r\n") {
		t.fail("FromImage: %q is not an image reference", ref)
	}
	return t
}

func (t *TemplateSteps) fail(format string, args ...any) {
	if t.err == nil {
		t.err = newError(0, CodeInvalid, fmt.Sprintf(format, args...))
	}
}

func noNewline(s string) bool { return !strings.ContainsAny(s, "\r\n\x00") }

// Run adds a RUN step: cmd, a /bin/sh -c script, runs in a build VM (with
// the network when the server's operator allows it).
func (t *TemplateSteps) Run(cmd string) *TemplateSteps {
	if strings.TrimSpace(cmd) == "" {
		t.fail("Run needs a command")
		return t
	}
	argv, _ := json.Marshal([]string{"/bin/sh", "-c", cmd})
	t.lines = append(t.lines, "RUN "+string(argv))
	return t
}

// Copy adds a COPY step: the local file or directory src (sent in the
// build context) to dst, owned by root.
func (t *TemplateSteps) Copy(src, dst string) *TemplateSteps { return t.CopyAs(src, dst, "") }

// CopyAs is Copy with what is copied owned by user ("name[:group]" or
// "uid[:gid]"; "" for root).
func (t *TemplateSteps) CopyAs(src, dst, user string) *TemplateSteps {
	if _, err := os.Lstat(src); err != nil {
		t.fail("Copy %s: %v", src, err)
		return t
	}
	if strings.TrimSpace(dst) == "" || !noNewline(dst) {
		t.fail("Copy %s: the destination %q is not a path", src, dst)
		return t
	}
	flag := ""
	if user != "" {
		if !stepUserRE.MatchString(user) {
			t.fail("Copy %s: user %q must be name[:group] or uid[:gid]", src, user)
			return t
		}
		flag = "--chown=" + user + " "
	}
	base := filepath.Base(filepath.Clean(src))
	if base == "/" || base == "." {
		base = "root"
	}
	name := fmt.Sprintf("copy-%d/%s", len(t.copies), base)
	args, _ := json.Marshal([]string{name, dst})
	t.lines = append(t.lines, "COPY "+flag+string(args))
	t.copies = append(t.copies, stepCopy{src: src, name: name})
	return t
}

// Env adds an ENV step: key=value for the steps after it and the
// template's commands.
func (t *TemplateSteps) Env(key, value string) *TemplateSteps {
	if !envNameRE.MatchString(key) || !noNewline(value) {
		t.fail("Env %q: a variable name and a value without newlines are required", key)
		return t
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`)
	t.lines = append(t.lines, fmt.Sprintf(`ENV %s="%s"`, key, r.Replace(value)))
	return t
}

// Workdir adds a WORKDIR step (the directory is created if missing).
func (t *TemplateSteps) Workdir(path string) *TemplateSteps {
	if strings.TrimSpace(path) == "" || !noNewline(path) {
		t.fail("Workdir %q is not a path", path)
		return t
	}
	t.lines = append(t.lines, "WORKDIR "+path)
	return t
}

// User adds a USER step: the steps after it, and the template's
// commands, run as name ("name[:group]" or "uid[:gid]").
func (t *TemplateSteps) User(name string) *TemplateSteps {
	if !stepUserRE.MatchString(name) {
		t.fail("User %q must be name[:group] or uid[:gid]", name)
		return t
	}
	t.lines = append(t.lines, "USER "+name)
	return t
}

// Dockerfile is the Dockerfile the steps make, or the first invalid
// step's error.
func (t *TemplateSteps) Dockerfile() (string, error) {
	if t.err != nil {
		return "", t.err
	}
	return "FROM " + t.from + "\n" + strings.Join(append(t.lines, ""), "\n"), nil
}

// writeContext copies each Copy's source into dir under its name
// (symbolic links as links, never followed).
func (t *TemplateSteps) writeContext(dir string) error {
	for _, c := range t.copies {
		if err := copyTree(c.src, filepath.Join(dir, filepath.FromSlash(c.name))); err != nil {
			return fmt.Errorf("copy %s into the build context: %w", c.src, err)
		}
	}
	return nil
}

func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		out := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(out, info.Mode().Perm()|0o700)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, out)
		case info.Mode().IsRegular():
			return copyFile(p, out, info.Mode().Perm())
		}
		return nil // devices, sockets and pipes are not sent
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// BuildTemplateSteps builds template name from steps (a Dockerfile build:
// see BuildTemplateFromDockerfile), sending the files of its Copy steps in
// a build context made in a temporary directory, removed before it
// returns. opts may set the template's start and ready commands.
func (c *Client) BuildTemplateSteps(ctx context.Context, name string, steps *TemplateSteps, progress func(string), opts ...BuildOption) (TemplateBuild, error) {
	df, err := steps.Dockerfile()
	if err != nil {
		return TemplateBuild{}, err
	}
	dir := ""
	if len(steps.copies) > 0 {
		if dir, err = os.MkdirTemp("", "pandastack-context-"); err != nil {
			return TemplateBuild{}, err
		}
		defer os.RemoveAll(dir)
		if err := steps.writeContext(dir); err != nil {
			return TemplateBuild{}, newError(0, CodeInvalid, err.Error())
		}
	}
	return c.BuildTemplateFromDockerfile(ctx, name, df, dir, progress, opts...)
}
