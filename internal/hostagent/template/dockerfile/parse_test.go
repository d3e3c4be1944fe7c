package dockerfile

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

func TestParseSupported(t *testing.T) {
	src := `# syntax=docker/dockerfile:1
ARG BASE=debian
FROM ${BASE}:12 AS app
RUN apt-get update && \
    apt-get install -y curl
RUN ["echo", "hi"]
COPY --chown=app:app --chmod=0644 a.txt b/ /dst/
ADD x.tar /opt/
ENV A=1 B="two words"
ENV C three four
ARG V=1
WORKDIR /app
USER app
CMD ["node", "server.js"]
ENTRYPOINT exec run
LABEL a=b
EXPOSE 8080/tcp
`
	f, err := parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.globalArgs) != 1 || f.from.line != 3 || f.from.args[0] != "${BASE}:12" {
		t.Fatalf("got global args %v, from %+v", f.globalArgs, f.from)
	}
	var got []string
	for _, s := range f.steps {
		got = append(got, s.cmd)
	}
	want := []string{"RUN", "RUN", "COPY", "ADD", "ENV", "ENV", "ARG", "WORKDIR", "USER", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	checks := []struct {
		i    int
		line int
		args []string
		json bool
	}{
		{0, 4, []string{"apt-get update &&     apt-get install -y curl"}, false},
		{1, 6, []string{"echo", "hi"}, true},
		{2, 7, []string{"a.txt", "b/", "/dst/"}, false},
		{4, 9, []string{"A", "1", "B", `"two words"`}, false},
		{5, 10, []string{"C", "three four"}, false},
		{9, 14, []string{"node", "server.js"}, true},
	}
	for _, c := range checks {
		s := f.steps[c.i]
		if s.line != c.line || !reflect.DeepEqual(s.args, c.args) || s.json != c.json {
			t.Errorf("step %d: got line %d args %q json %v, want line %d args %q json %v", c.i, s.line, s.args, s.json, c.line, c.args, c.json)
		}
	}
	if fl := f.steps[2].flags; !reflect.DeepEqual(fl, []string{"--chown=app:app", "--chmod=0644"}) {
		t.Errorf("got COPY flags %q", fl)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"healthcheck", "FROM a\nRUN x\n\n\n\n\nHEALTHCHECK CMD true\n",
			"Dockerfile line 7: HEALTHCHECK is not supported (supported: FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT, LABEL, EXPOSE)"},
		{"onbuild", "FROM a\nONBUILD RUN x\n", "Dockerfile line 2: ONBUILD is not supported"},
		{"volume", "FROM a\nVOLUME /data\n", "Dockerfile line 2: VOLUME is not supported"},
		{"shell", "FROM a\nSHELL [\"bash\", \"-c\"]\n", "Dockerfile line 2: SHELL is not supported"},
		{"stopsignal", "FROM a\nSTOPSIGNAL TERM\n", "Dockerfile line 2: STOPSIGNAL is not supported"},
		{"multi-stage", "FROM a AS b\nRUN x\nFROM b\n", "Dockerfile line 3: a second FROM: multi-stage builds are not supported"},
		{"run mount", "FROM a\nRUN --mount=type=cache,target=/x make\n", "Dockerfile line 2: RUN --mount (cache, secret and bind mounts) is not supported"},
		{"copy from", "FROM a\nCOPY --from=b /x /y\n", "Dockerfile line 2: COPY --from (multi-stage builds) is not supported"},
		{"add checksum", "FROM a\nADD --checksum=sha256:00 x /y\n", "Dockerfile line 2: ADD --checksum is not supported"},
		{"from platform", "FROM --platform=linux/arm64 a\n", "Dockerfile line 1: FROM --platform is not supported"},
		{"heredoc", "FROM a\nRUN <<EOF\necho hi\nEOF\n", "Dockerfile line 2: heredocs (<<) in RUN are not supported"},
		{"before from", "RUN x\nFROM a\n", "Dockerfile line 1: RUN before FROM"},
		{"no from", "ARG A=1\n", "the Dockerfile has no FROM instruction"},
		{"unknown", "FROM a\n\nFOO bar\n", "Dockerfile line 3: unknown instruction FOO"},
		{"copy one arg", "FROM a\nCOPY x\n", "Dockerfile line 2: COPY needs a source and a destination"},
		{"empty run", "FROM a\nRUN\n", "Dockerfile line 2: RUN needs arguments"},
		{"env syntax", "FROM a\nENV A=1 B\n", "Dockerfile line 2: "},
		{"too big", "FROM a\n" + strings.Repeat("#", MaxDockerfileBytes), "larger than"},
		{"too many", "FROM a\n" + strings.Repeat("RUN x\n", MaxSteps), "instructions; at most 500"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.src))
			if err == nil {
				t.Fatalf("got no error, want %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want an ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

// planOf parses src and plans it over a base image with env PATH and LANG.
func planOf(t *testing.T, src string, buildArgs map[string]string, bctx *buildContext) (*plan, error) {
	t.Helper()
	f, err := parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if err := declaredArgs(f, buildArgs); err != nil {
		return nil, err
	}
	_, globals, err := fromRef(f, buildArgs)
	if err != nil {
		return nil, err
	}
	base := templates.ImageConfig{Env: []string{"PATH=/usr/bin", "LANG=C"}, Cmd: []string{"bash"}, WorkingDir: "/srv"}
	return makePlan(context.Background(), f, base, "basekey", buildArgs, globals, bctx)
}

func TestFromExpansion(t *testing.T) {
	src := "ARG TAG=12\nARG REG\nFROM ${REG:-docker.io}/debian:${TAG}\n"
	tests := []struct {
		args map[string]string
		want string
	}{
		{nil, "docker.io/debian:12"},
		{map[string]string{"TAG": "13"}, "docker.io/debian:13"},
		{map[string]string{"REG": "r.example:5000"}, "r.example:5000/debian:12"},
	}
	for _, tt := range tests {
		f, err := parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := fromRef(f, tt.args)
		if err != nil || got != tt.want {
			t.Errorf("args %v: got %q, %v, want %q", tt.args, got, err, tt.want)
		}
	}
	f, _ := parse([]byte("FROM scratch\n"))
	if _, _, err := fromRef(f, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("FROM scratch: got %v, want ErrInvalid", err)
	}
}

func TestArgEnvExpansion(t *testing.T) {
	src := `ARG GLOBAL=g
FROM img
ARG GLOBAL
ARG VER=1.0
ARG NODEF
ENV APP_VER=$VER HOME_DIR=/home/${USERNAME:-app} LANG=en
ENV VER=env-wins
RUN echo $VER
WORKDIR ${HOME_DIR}
WORKDIR sub
USER ${GLOBAL}:staff
ENTRYPOINT ["run"]
`
	p, err := planOf(t, src, map[string]string{"VER": "2.0", "HTTP_PROXY": "http://proxy:3128"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	run := p.steps[5]
	if run.kind != runStep || run.exec.Shell != "echo $VER" {
		t.Fatalf("got step 5 %+v, want the RUN", run)
	}
	wantEnv := map[string]string{"GLOBAL": "g", "VER": "env-wins", "PATH": "/usr/bin", "LANG": "en",
		"APP_VER": "2.0", "HOME_DIR": "/home/app", "HTTP_PROXY": "http://proxy:3128"}
	if !reflect.DeepEqual(run.exec.Env, wantEnv) {
		t.Errorf("RUN env: got %v, want %v", run.exec.Env, wantEnv)
	}
	if run.exec.Cwd != "/srv" || run.exec.User != "" {
		t.Errorf("RUN cwd, user: got %q, %q, want /srv and root", run.exec.Cwd, run.exec.User)
	}
	if p.steps[6].dir != "/home/app" || p.steps[7].dir != "/home/app/sub" {
		t.Errorf("WORKDIRs: got %q, %q", p.steps[6].dir, p.steps[7].dir)
	}
	want := templates.ImageConfig{
		Env:        []string{"PATH=/usr/bin", "LANG=en", "APP_VER=2.0", "HOME_DIR=/home/app", "VER=env-wins"},
		WorkingDir: "/home/app/sub",
		User:       "g:staff",
		Entrypoint: []string{"run"},
	}
	if !reflect.DeepEqual(p.image, want) {
		t.Errorf("image: got %+v, want %+v", p.image, want)
	}
	// ARGs and proxies are not part of the image.
	for _, e := range p.image.Env {
		if strings.HasPrefix(e, "GLOBAL=") || strings.HasPrefix(e, "HTTP_PROXY=") {
			t.Errorf("image env has %q", e)
		}
	}
}

// TestProxyArgsInKey: a proxy build arg reaches the RUN steps' keys (a
// layer fetched through one proxy is not one fetched through another),
// in either case, as every other build arg that reaches a step does.
func TestProxyArgsInKey(t *testing.T) {
	src := "FROM img\nWORKDIR /w\nRUN make\nRUN make install\n"
	a, err := planOf(t, src, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "FTP_PROXY", "ftp_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"} {
		b, err := planOf(t, src, map[string]string{name: "http://p:1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if a.steps[0].key != b.steps[0].key {
			t.Errorf("%s changed the key of the WORKDIR before any RUN", name)
		}
		if a.steps[1].key == b.steps[1].key || a.steps[2].key == b.steps[2].key {
			t.Errorf("%s kept the RUN steps' keys", name)
		}
		if b.steps[1].exec.Env[name] != "http://p:1" {
			t.Errorf("%s does not reach the RUN: env %v", name, b.steps[1].exec.Env)
		}
	}
	c, err := planOf(t, "FROM img\nARG X\nRUN make\n", map[string]string{"X": "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := planOf(t, "FROM img\nARG X\nRUN make\n", map[string]string{"X": "2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.steps[1].key == d.steps[1].key {
		t.Errorf("a changed ARG value kept the RUN's key")
	}
}

func TestCmdEntrypoint(t *testing.T) {
	tests := []struct {
		src             string
		wantEP, wantCmd []string
	}{
		{"FROM img\nCMD make run\n", nil, []string{"/bin/sh", "-c", "make run"}},
		{"FROM img\nENTRYPOINT [\"/init\"]\n", []string{"/init"}, nil}, // resets the base's CMD
		{"FROM img\nCMD [\"x\"]\nENTRYPOINT [\"/init\"]\n", []string{"/init"}, []string{"x"}},
		{"FROM img\nENTRYPOINT /init\nCMD [\"x\"]\n", []string{"/bin/sh", "-c", "/init"}, []string{"x"}},
		{"FROM img\nENV A=1\n", nil, []string{"bash"}},
	}
	for _, tt := range tests {
		p, err := planOf(t, tt.src, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p.image.Entrypoint, tt.wantEP) || !reflect.DeepEqual(p.image.Cmd, tt.wantCmd) {
			t.Errorf("%q: got entrypoint %q cmd %q, want %q %q", tt.src, p.image.Entrypoint, p.image.Cmd, tt.wantEP, tt.wantCmd)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	tests := []struct {
		name, src string
		args      map[string]string
		want      string
	}{
		{"unknown build arg", "FROM img\nARG A\n", map[string]string{"B": "1", "A": "2"}, "build arg B is not declared by an ARG"},
		{"bad user", "FROM img\nUSER a:b:c\n", nil, "Dockerfile line 2: USER"},
		{"bad chmod", "FROM img\nCOPY --chmod=u+x a /b\n", nil, "Dockerfile line 2: COPY --chmod=\"u+x\": only octal modes"},
		{"bad chown", "FROM img\nCOPY --chown=a:b:c a /b\n", nil, "Dockerfile line 2: COPY --chown"},
		{"add url", "FROM img\n\nADD https://example.com/x.tgz /x\n", nil, "Dockerfile line 3: ADD of a URL"},
		{"no context", "FROM img\nCOPY a /b\n", nil, "Dockerfile line 2: COPY needs a build context"},
		{"bad expansion", "FROM img\nENV A=${B:?required}\n", nil, "Dockerfile line 2: ENV: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := planOf(t, tt.src, tt.args, nil)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	if err := Check([]byte("FROM a\nARG X\nRUN echo $X\n"), map[string]string{"X": "1"}); err != nil {
		t.Errorf("got %v, want nil", err)
	}
	if err := Check([]byte("FROM a\nRUN x\n"), map[string]string{"X": "1"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("got %v, want ErrInvalid", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("FROM a\nRUN x\n"))
	f.Add([]byte("ARG B=1\nFROM x:${B}\nCOPY --chown=a a* /b/\nENV A=1 B=\"2 3\"\nRUN [\"a\"]\n"))
	f.Add([]byte("# escape=`\nFROM a\nRUN a `\n b\nRUN <<EOF\nx\nEOF\n"))
	f.Add([]byte("FROM a\nENV A\nLABEL\nUSER\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, err := parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("parse error %v is not ErrInvalid", err)
			}
			return
		}
		// Evaluation must not panic either.
		if _, _, err := fromRef(fl, nil); err == nil {
			makePlan(context.Background(), fl, templates.ImageConfig{}, "k", nil, nil, nil)
		}
	})
}
