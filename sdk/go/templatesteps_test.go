package pandastack

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestTemplateSteps(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "f.txt"), []byte("x"), 0o640)
	os.Mkdir(filepath.Join(src, "sub"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "g"), []byte("g"), 0o755)
	os.Symlink("f.txt", filepath.Join(src, "link"))
	s := FromImage("tiny").
		Run(`echo "hi" && ls`).
		CopyAs(filepath.Join(src, "f.txt"), "/srv/f.txt", "nobody:nogroup").
		Copy(src, "/srv/all/").
		Env("A", `q"d$v\b`).
		Workdir("/srv").
		User("nobody")
	df, err := s.Dockerfile()
	if err != nil {
		t.Fatal(err)
	}
	want := "FROM tiny\n" +
		`RUN ["/bin/sh","-c","echo \"hi\" \u0026\u0026 ls"]` + "\n" +
		`COPY --chown=nobody:nogroup ["copy-0/f.txt","/srv/f.txt"]` + "\n" +
		`COPY ["copy-1/` + filepath.Base(src) + `","/srv/all/"]` + "\n" +
		`ENV A="q\"d\$v\\b"` + "\n" +
		"WORKDIR /srv\nUSER nobody\n"
	if df != want {
		t.Errorf("Dockerfile:\n%s\nwant:\n%s", df, want)
	}
	ctxDir := t.TempDir()
	if err := s.writeContext(ctxDir); err != nil {
		t.Fatal(err)
	}
	for name, wantMode := range map[string]os.FileMode{
		"copy-0/f.txt": 0o640, "copy-1/" + filepath.Base(src) + "/sub/g": 0o755,
		"copy-1/" + filepath.Base(src) + "/link": os.ModeSymlink | 0o777,
	} {
		st, err := os.Lstat(filepath.Join(ctxDir, name))
		if err != nil || st.Mode() != wantMode {
			t.Errorf("context %s: %v, %v; want mode %v", name, st, err, wantMode)
		}
	}
	// The first bad step is the error, whatever comes after it.
	for _, bad := range []*TemplateSteps{
		FromImage(""), FromImage("tiny").Run(" "), FromImage("tiny").Copy("/nonexistent/x", "/x"),
		FromImage("tiny").Copy(src, ""), FromImage("tiny").CopyAs(src, "/x", "a b"),
		FromImage("tiny").Env("1A", "x"), FromImage("tiny").Env("A", "line\nbreak"),
		FromImage("tiny").Workdir(""), FromImage("tiny").User("a b").Run("true"),
	} {
		_, err := bad.Dockerfile()
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeInvalid {
			t.Errorf("bad steps: %v, want an invalid error", err)
		}
	}
}
