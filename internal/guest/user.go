package guest

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// execUser is who an exec runs as: ids for the kernel and, when the user has
// a passwd entry, its name and home directory.
type execUser struct {
	uid, gid uint32
	groups   []uint32 // supplementary groups, without gid
	name     string   // "" without a passwd entry
	home     string   // "" without a passwd entry
}

// passwdEntry is one line of /etc/passwd.
type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// groupEntry is one line of /etc/group.
type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

// resolveUser resolves a user spec (guestproto.ValidateUser) the way Docker
// resolves USER, from root's etc/passwd and etc/group, parsed here because
// the agent is static and has no libc:
//
//   - a name must have a passwd entry; a numeric uid need not (then the
//     primary group is 0 and there is no name or home, as in Docker);
//   - the group part, if any, replaces the primary group; a name must have
//     a group entry;
//   - the supplementary groups are those of /etc/group that list the
//     user's name.
//
// An unknown name is a *guestproto.Error of CodeNotFound naming it.
func resolveUser(root, spec string) (execUser, error) {
	if err := guestproto.ValidateUser(spec); err != nil {
		return execUser{}, guestproto.Errorf(guestproto.CodeInvalid, "%v", err)
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	users, err := readPasswd(filepath.Join(root, "etc/passwd"))
	if err != nil {
		return execUser{}, err
	}
	var u execUser
	uid, numeric := guestproto.ParseID(userPart)
	found := false
	for _, e := range users {
		if (numeric && e.uid == uid) || (!numeric && e.name == userPart) {
			u = execUser{uid: e.uid, gid: e.gid, name: e.name, home: e.home}
			found = true
			break
		}
	}
	switch {
	case !found && !numeric:
		return execUser{}, guestproto.Errorf(guestproto.CodeNotFound, "user %q not found in the sandbox's /etc/passwd", userPart)
	case !found:
		u = execUser{uid: uid}
	}

	var groups []groupEntry
	if hasGroup || u.name != "" {
		if groups, err = readGroup(filepath.Join(root, "etc/group")); err != nil {
			return execUser{}, err
		}
	}
	if hasGroup {
		gid, numeric := guestproto.ParseID(groupPart)
		if !numeric {
			found := false
			for _, g := range groups {
				if g.name == groupPart {
					gid, found = g.gid, true
					break
				}
			}
			if !found {
				return execUser{}, guestproto.Errorf(guestproto.CodeNotFound, "group %q not found in the sandbox's /etc/group", groupPart)
			}
		}
		u.gid = gid
	}
	if u.name != "" {
		for _, g := range groups {
			if g.gid != u.gid && !containsUint(u.groups, g.gid) && containsString(g.members, u.name) {
				u.groups = append(u.groups, g.gid)
			}
		}
	}
	return u, nil
}

func containsUint(s []uint32, v uint32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// readPasswd parses a passwd file; a missing file has no entries, and
// malformed lines are skipped (as libc does).
func readPasswd(path string) ([]passwdEntry, error) {
	var out []passwdEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 7 {
			return
		}
		uid, ok1 := guestproto.ParseID(f[2])
		gid, ok2 := guestproto.ParseID(f[3])
		if f[0] == "" || !ok1 || !ok2 {
			return
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	})
	return out, err
}

// readGroup parses a group file like readPasswd.
func readGroup(path string) ([]groupEntry, error) {
	var out []groupEntry
	err := readColonFile(path, func(f []string) {
		if len(f) < 4 {
			return
		}
		gid, ok := guestproto.ParseID(f[2])
		if f[0] == "" || !ok {
			return
		}
		var members []string
		for _, m := range strings.Split(f[3], ",") {
			if m = strings.TrimSpace(m); m != "" {
				members = append(members, m)
			}
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	})
	return out, err
}

// maxAccountFile bounds what is read of /etc/passwd or /etc/group: the
// guest's user may have made them anything.
const maxAccountFile = 16 << 20

func readColonFile(path string, line func([]string)) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(&limitedReader{f: f, n: maxAccountFile})
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		t := sc.Text()
		if t == "" || t[0] == '#' {
			continue
		}
		line(strings.Split(t, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	return nil
}

type limitedReader struct {
	f *os.File
	n int64
}

func (r *limitedReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, fmt.Errorf("larger than %d bytes", maxAccountFile)
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	n, err := r.f.Read(p)
	r.n -= int64(n)
	return n, err
}
