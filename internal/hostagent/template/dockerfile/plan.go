package dockerfile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// proxyArgs are Docker's predefined ARGs: build args of these names need
// no ARG and are visible to RUN only. Unlike Docker, they are part of the
// keys of the RUN steps they reach (and so of every layer after): a layer
// made through one proxy is not what a build through another expects.
var proxyArgs = map[string]bool{
	"HTTP_PROXY": true, "http_proxy": true, "HTTPS_PROXY": true, "https_proxy": true,
	"FTP_PROXY": true, "ftp_proxy": true, "NO_PROXY": true, "no_proxy": true,
	"ALL_PROXY": true, "all_proxy": true,
}

type stepKind int

const (
	metaStep    stepKind = iota // changes only the image config
	runStep                     // RUN
	copyStep                    // COPY, ADD
	workdirStep                 // WORKDIR: creates the directory
)

// step is one evaluated instruction.
type step struct {
	// n is its number among the Dockerfile's instructions (FROM is 1,
	// ARGs before FROM are not counted).
	n    int
	in   instr
	kind stepKind
	// exec is what a RUN runs (also with the env, cwd and user).
	exec guestproto.ExecRequest
	copy *copySpec
	// dir is the directory a WORKDIR creates; user its owner ("" root).
	dir, user string
	// note is a progress note of a metadata step.
	note string
	// key is a disk step's layer key (hex sha256).
	key string
	// image is the image config after this step.
	image templates.ImageConfig
}

// plan is an evaluated Dockerfile.
type plan struct {
	steps []step
	image templates.ImageConfig
}

// declaredArgs checks that every build arg is declared by an ARG (or is one
// of Docker's predefined proxy args).
func declaredArgs(f *file, buildArgs map[string]string) error {
	declared := map[string]bool{}
	for _, in := range append(slices.Clone(f.globalArgs), f.steps...) {
		if in.cmd != "ARG" {
			continue
		}
		for _, w := range in.args {
			name, _, _ := strings.Cut(w, "=")
			declared[name] = true
		}
	}
	var unknown []string
	for k := range buildArgs {
		if !declared[k] && !proxyArgs[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return invalidf("build arg %s is not declared by an ARG in the Dockerfile", cut(strings.Join(unknown, ", "), 200))
	}
	return nil
}

// argValues evaluates the ARGs of ins (in order) over env, returning the
// declared ones with a value as NAME=value entries, in order. globals are
// the values of the ARGs before FROM, the defaults of a bare "ARG NAME".
func argValue(lex *shell.Lex, in instr, word string, env []string, buildArgs, globals map[string]string) (name, value string, set bool, err error) {
	name, def, hasDef := strings.Cut(word, "=")
	if name == "" {
		return "", "", false, lineErr(in.line, "ARG needs a name")
	}
	if v, ok := buildArgs[name]; ok {
		return name, v, true, nil
	}
	if hasDef {
		v, err := expand(lex, in, def, env)
		return name, v, err == nil, err
	}
	if v, ok := globals[name]; ok {
		return name, v, true, nil
	}
	return name, "", false, nil
}

func expand(lex *shell.Lex, in instr, word string, env []string) (string, error) {
	out, _, err := lex.ProcessWord(word, shell.EnvsFromSlice(env))
	if err != nil {
		return "", lineErr(in.line, "%s: %s", in.cmd, cut(err.Error(), 300))
	}
	return out, nil
}

// fromRef evaluates the ARGs before FROM and expands FROM's image.
func fromRef(f *file, buildArgs map[string]string) (ref string, globals map[string]string, err error) {
	lex := shell.NewLex(f.escape)
	globals = map[string]string{}
	var env []string
	for _, in := range f.globalArgs {
		for _, w := range in.args {
			name, v, set, err := argValue(lex, in, w, env, buildArgs, nil)
			if err != nil {
				return "", nil, err
			}
			if set {
				globals[name] = v
				env = append(env, name+"="+v)
			}
		}
	}
	ref, err = expand(lex, f.from, f.from.args[0], env)
	if err != nil {
		return "", nil, err
	}
	switch {
	case ref == "":
		return "", nil, lineErr(f.from.line, "FROM names no image")
	case strings.EqualFold(ref, "scratch"):
		return "", nil, lineErr(f.from.line, "FROM scratch is not supported: start from an image with a shell")
	}
	return ref, globals, nil
}

// makePlan evaluates f's steps over the base image, resolving COPY and ADD
// sources in bctx (nil: no context). baseKey is the base layer's key.
func makePlan(ctx context.Context, f *file, base templates.ImageConfig, baseKey string, buildArgs, globals map[string]string, bctx *buildContext) (*plan, error) {
	pl := &planner{lex: shell.NewLex(f.escape), img: base, buildArgs: buildArgs, globals: globals, bctx: bctx}
	pl.img.Env = slices.Clone(base.Env)
	p := &plan{}
	parent := baseKey
	for i, in := range f.steps {
		s := step{n: i + 2, in: in}
		if err := pl.eval(ctx, &s); err != nil {
			return nil, err
		}
		if s.kind != metaStep {
			s.key = stepKey(parent, s, pl.workdir(), pl.img.User)
			parent = s.key
		}
		s.image = cloneImage(pl.img)
		p.steps = append(p.steps, s)
	}
	p.image = cloneImage(pl.img)
	return p, nil
}

// planner is makePlan's state between instructions: the image config as
// the steps so far leave it, and the stage's ARGs.
type planner struct {
	lex       *shell.Lex
	img       templates.ImageConfig
	args      []string // NAME=value of the stage's ARGs with a value
	cmdSet    bool     // a CMD set img.Cmd: an ENTRYPOINT keeps it
	buildArgs map[string]string
	globals   map[string]string // the ARGs before FROM
	bctx      *buildContext
}

// exp is the environment instructions are expanded with: ARGs, then ENV
// over them (ENV wins, as in Docker).
func (pl *planner) exp() []string { return append(slices.Clone(pl.args), pl.img.Env...) }

// workdir is the working directory of the steps so far ("/" if none).
func (pl *planner) workdir() string {
	if pl.img.WorkingDir == "" {
		return "/"
	}
	return pl.img.WorkingDir
}

// eval evaluates instruction s.in: it updates the image config and the
// ARGs, and sets what s does (its kind and, for a disk step, what it runs,
// copies or creates; a note for an instruction templates ignore).
func (pl *planner) eval(ctx context.Context, s *step) error {
	in := s.in
	switch in.cmd {
	case "ARG":
		return pl.evalArg(in)
	case "ENV":
		return pl.evalEnv(in)
	case "WORKDIR":
		return pl.evalWorkdir(s)
	case "USER":
		return pl.evalUser(in)
	case "CMD", "ENTRYPOINT":
		pl.evalCmd(in)
	case "LABEL", "MAINTAINER":
		s.note = "  ignored: templates keep no labels"
	case "EXPOSE":
		s.note = "  ignored: a sandbox's ports are all reachable from its host"
	case "RUN":
		return pl.evalRun(s)
	case "COPY", "ADD":
		cs, err := evalCopy(ctx, pl.lex, in, pl.exp(), pl.workdir(), pl.bctx)
		if err != nil {
			return err
		}
		s.kind, s.copy, s.user = copyStep, cs, pl.img.User
	}
	return nil
}

// evalArg declares the ARGs of in, each with its value (a build arg, its
// default, or the global of its name) or none.
func (pl *planner) evalArg(in instr) error {
	for _, w := range in.args {
		name, v, set, err := argValue(pl.lex, in, w, pl.exp(), pl.buildArgs, pl.globals)
		if err != nil {
			return err
		}
		pl.args = slices.DeleteFunc(pl.args, func(e string) bool { return strings.HasPrefix(e, name+"=") })
		if set {
			pl.args = append(pl.args, name+"="+v)
		}
	}
	return nil
}

// evalEnv sets the variables of in (key, value pairs, all expanded over
// the environment before it) in the image's environment.
func (pl *planner) evalEnv(in instr) error {
	env := pl.exp()
	var kv []string
	for j := 0; j+1 < len(in.args); j += 2 {
		k, err := expand(pl.lex, in, in.args[j], env)
		if err != nil {
			return err
		}
		v, err := expand(pl.lex, in, in.args[j+1], env)
		if err != nil {
			return err
		}
		if k == "" || strings.ContainsAny(k, "= \t\x00") {
			return lineErr(in.line, "ENV: %q is not a variable name", cut(k, 60))
		}
		kv = append(kv, k, v)
	}
	for j := 0; j < len(kv); j += 2 {
		pl.img.Env = setEnv(pl.img.Env, kv[j], kv[j+1])
	}
	return nil
}

// evalWorkdir sets the working directory (relative to the one before)
// and makes s the step that creates it, owned by the current user.
func (pl *planner) evalWorkdir(s *step) error {
	in := s.in
	d, err := expand(pl.lex, in, in.args[0], pl.exp())
	if err != nil {
		return err
	}
	if d == "" {
		return lineErr(in.line, "WORKDIR needs a directory")
	}
	if !path.IsAbs(d) {
		d = path.Join(pl.workdir(), d)
	}
	pl.img.WorkingDir = path.Clean(d)
	s.kind, s.dir, s.user = workdirStep, pl.img.WorkingDir, pl.img.User
	return nil
}

// evalUser sets the user of the steps after it and of the image.
func (pl *planner) evalUser(in instr) error {
	u, err := expand(pl.lex, in, in.args[0], pl.exp())
	if err != nil {
		return err
	}
	if err := guestproto.ValidateUser(u); err != nil {
		return lineErr(in.line, "USER %q: %v", cut(u, 60), err)
	}
	pl.img.User = u
	return nil
}

// evalCmd sets the image's CMD or ENTRYPOINT (shell form: through
// /bin/sh -c). As in Docker, an ENTRYPOINT resets the base image's CMD,
// not one the Dockerfile set.
func (pl *planner) evalCmd(in instr) {
	argv := slices.Clone(in.args)
	if !in.json {
		argv = []string{"/bin/sh", "-c", strings.Join(in.args, " ")}
	}
	if in.cmd == "CMD" {
		pl.img.Cmd, pl.cmdSet = argv, true
		return
	}
	pl.img.Entrypoint = argv
	if !pl.cmdSet {
		// Docker: an ENTRYPOINT resets the base image's CMD.
		pl.img.Cmd = nil
	}
}

// evalRun makes s a RUN step: its command, with the stage's ARGs, the
// image's environment and the proxy build args, in the working directory
// as the current user.
func (pl *planner) evalRun(s *step) error {
	in := s.in
	s.kind = runStep
	if in.json {
		s.exec.Argv = slices.Clone(in.args)
		if len(s.exec.Argv) == 0 || s.exec.Argv[0] == "" {
			return lineErr(in.line, "RUN needs a command")
		}
	} else {
		s.exec.Shell = strings.Join(in.args, " ")
	}
	s.exec.Env = withProxyArgs(envMap(append(slices.Clone(pl.args), pl.img.Env...)), pl.buildArgs)
	s.exec.Cwd = pl.workdir()
	s.exec.User = pl.img.User
	return nil
}

// withProxyArgs adds the proxy build args of buildArgs that env (a RUN's
// environment) does not set already; they reach RUN steps, and with their
// environment their keys, but never the image.
func withProxyArgs(env, buildArgs map[string]string) map[string]string {
	for k, v := range buildArgs {
		if !proxyArgs[k] {
			continue
		}
		if _, ok := env[k]; !ok {
			if env == nil {
				env = map[string]string{}
			}
			env[k] = v
		}
	}
	return env
}

// evalCopy expands a COPY or ADD and resolves its sources in bctx.
func evalCopy(ctx context.Context, lex *shell.Lex, in instr, env []string, workdir string, bctx *buildContext) (*copySpec, error) {
	cs := &copySpec{Add: in.cmd == "ADD"}
	for _, fl := range in.flags {
		name, val, _ := strings.Cut(strings.TrimPrefix(fl, "--"), "=")
		v, err := expand(lex, in, val, env)
		if err != nil {
			return nil, err
		}
		switch name {
		case "chown":
			if err := guestproto.ValidateUser(v); err != nil || v == "" {
				return nil, lineErr(in.line, "%s --chown=%q: not a user or user:group", in.cmd, cut(v, 60))
			}
			cs.Chown = v
		case "chmod":
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 07777 {
				return nil, lineErr(in.line, "%s --chmod=%q: only octal modes (like 0755) are supported", in.cmd, cut(v, 60))
			}
			mode := int64(m)
			cs.Chmod = &mode
		}
	}
	words := make([]string, len(in.args))
	for i, a := range in.args {
		v, err := expand(lex, in, a, env)
		if err != nil {
			return nil, err
		}
		words[i] = v
	}
	srcs, dst := words[:len(words)-1], words[len(words)-1]
	for _, s := range srcs {
		if isURL(s) {
			return nil, lineErr(in.line, "%s of a URL (%s) is not supported: download it in a RUN step", in.cmd, cut(s, 100))
		}
	}
	if dst == "" {
		return nil, lineErr(in.line, "%s needs a destination", in.cmd)
	}
	cs.DstDir = strings.HasSuffix(dst, "/") || dst == "." || strings.HasSuffix(dst, "/.")
	if !path.IsAbs(dst) {
		dst = path.Join(workdir, dst)
	}
	cs.Dst = path.Clean(dst)
	if cs.Dst == "/" {
		cs.DstDir = true
	}
	cs.Srcs = srcs
	if bctx == nil {
		return nil, lineErr(in.line, "%s needs a build context, and this build has none", in.cmd)
	}
	if err := bctx.resolve(ctx, cs); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, lineErr(in.line, "%s: %v", in.cmd, err)
	}
	return cs, nil
}

func isURL(s string) bool {
	for _, p := range []string{"http://", "https://", "git@", "git://", "ssh://"} {
		if strings.HasPrefix(strings.ToLower(s), p) {
			return true
		}
	}
	return false
}

// stepKey is a disk step's layer key.
func stepKey(parent string, s step, workdir, user string) string {
	k := struct {
		Parent  string            `json:"parent"`
		Cmd     string            `json:"cmd"`
		Argv    []string          `json:"argv,omitempty"`
		Shell   string            `json:"shell,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
		Dir     string            `json:"dir,omitempty"`
		Copy    *copySpec         `json:"copy,omitempty"`
		Workdir string            `json:"workdir"`
		User    string            `json:"user"`
	}{Parent: parent, Cmd: s.in.cmd, Workdir: workdir, User: user, Dir: s.dir, Copy: s.copy}
	if s.kind == runStep {
		k.Argv, k.Shell, k.Env = s.exec.Argv, s.exec.Shell, s.exec.Env
	}
	b, err := json.Marshal(k)
	if err != nil {
		panic(err) // strings and maps of strings always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// setEnv sets key to value in env (KEY=value entries), keeping its place.
func setEnv(env []string, key, value string) []string {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			env[i] = key + "=" + value
			return env
		}
	}
	return append(env, key+"="+value)
}

// envMap is env as a map, later entries winning.
func envMap(env []string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			m[k] = v
		}
	}
	return m
}

func cloneImage(c templates.ImageConfig) templates.ImageConfig {
	c.Env = slices.Clone(c.Env)
	c.Entrypoint = slices.Clone(c.Entrypoint)
	c.Cmd = slices.Clone(c.Cmd)
	return c
}
