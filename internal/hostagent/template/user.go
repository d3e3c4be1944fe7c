package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"golang.org/x/sys/unix"
)

// User root filesystems are built from users' container images (see
// package tmplbuild) and kept in Config.UserDir, one directory per version,
// the latest reached through a symlink named after the template:
//
//	UserDir/NAME -> .v-NAME-RAND/   (rootfs.ext4, config.json: the latest)
//	UserDir/.v-NAME-RAND2/          (an older version of NAME)
//
// Each build of NAME that succeeds is a new version, numbered from 1
// (UserRootFS.Version; a config.json without one, written before versions
// existed, is version 1). Versions are kept until they are removed
// (RemoveUserVersion, or RemoveUserRootFS for all of them): sandboxes and
// snapshots name the version they were made from, "NAME:N" (a reference,
// SplitRef), and a pinned version is baked from its own root filesystem
// under its own key (Params.Key: NAME.vN-MEMm-CPUc), so a new version
// makes none of its shapes stale. Plain "NAME" means the latest version;
// its shapes (key NAME-MEMm-CPUc) become stale when a new version is
// installed, as their recorded rootfs hash no longer matches (Lookup).
//
// Installing a new version writes its directory completely, then renames a
// new symlink over NAME: a reader sees the old version or the new one,
// never a mix of an old rootfs.ext4 and a new config.json. The template's
// owner (the key that built its first version) is the latest version's
// config.json's; an install carries it over from the version it follows.
//
// Publishing is per version (UserRootFS.Published, SetUserPublished): a
// published version is usable by every key, and an install never
// publishes the version it makes, so a rebuild of a published template is
// its owner's alone until it is published in turn. Configs written before
// that (a "public" flag in the latest version's config.json, meaning every
// version, later ones too) count as the latest version published and the
// others not; the first change of the template's versions or flags
// rewrites them so (settleLegacyPublic).
//
// A version number never names two builds: UserDir/.last-NAME keeps the
// highest version NAME ever had, and removing versions (or the whole
// template) keeps it, so a later build takes the next number. Hosts of a
// fleet keep copies of versions built elsewhere (InstallUserReplica) under
// the same numbers, which they can then trust to be the same bytes.
//
// A user root filesystem never shadows a built-in one: names of the images
// directory's root filesystems, and base and tiny always, are refused.

// userConfigFile holds a user root filesystem's UserRootFS.
const userConfigFile = "config.json"

// IsBuiltin reports whether name is, or is reserved for, a built-in root
// filesystem.
func (s *Store) IsBuiltin(name string) bool {
	name, _, _ = strings.Cut(name, ":")
	for _, r := range templates.Reserved {
		if name == r {
			return true
		}
	}
	_, err := os.Stat(s.cfg.Images.RootFS(name))
	return err == nil
}

// ValidateUserName checks that name can name a user template: the rules
// of template names, and not a built-in one's.
func (s *Store) ValidateUserName(name string) error {
	if !templates.ValidName(name) {
		return fmt.Errorf("%w: template name %q must be 1-32 lowercase letters, digits, - or _", templates.ErrInvalid, name)
	}
	if s.IsBuiltin(name) {
		return fmt.Errorf("%w: %q is a built-in template; pick another name", templates.ErrInvalid, name)
	}
	if name == templates.NotAName {
		return fmt.Errorf("%w: %q names the API's list of builds (/v1/templates/builds); pick another name", templates.ErrInvalid, name)
	}
	return nil
}

// rootfsPath returns the root filesystem image of template reference ref:
// the built-in one if there is one, else the user's (its latest version,
// or the version ref pins); "" if neither exists.
func (s *Store) rootfsPath(ref string) string {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return ""
	}
	if p := s.cfg.Images.RootFS(name); v == 0 && fileExists(p) {
		return p
	}
	if s.cfg.UserDir == "" || s.IsBuiltin(name) {
		return ""
	}
	dir := filepath.Join(s.cfg.UserDir, name)
	if v > 0 {
		dir = s.versionDir(name, v)
		if dir == "" {
			return ""
		}
	}
	if p := filepath.Join(dir, "rootfs.ext4"); fileExists(p) {
		return p
	}
	return ""
}

// versionDir returns the directory of version v of user template name, ""
// if there is none.
func (s *Store) versionDir(name string, v int) string {
	for _, d := range s.versionDirs(name) {
		if d.u.Version == v {
			return d.dir
		}
	}
	return ""
}

type versionDirEnt struct {
	dir string
	u   templates.UserRootFS
}

// versionDirs returns the installed-or-staged version directories of user
// template name that hold a readable config.json, by version.
func (s *Store) versionDirs(name string) []versionDirEnt {
	ents, _ := os.ReadDir(s.cfg.UserDir)
	var out []versionDirEnt
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".v-"+name+"-") {
			continue
		}
		dir := filepath.Join(s.cfg.UserDir, e.Name())
		u, err := readUserConfig(dir)
		if err != nil || u.Name != name {
			continue // not installed, or another name's (".v-app-x-" is app-x's)
		}
		out = append(out, versionDirEnt{dir, u})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].u.Version < out[j].u.Version })
	return out
}

// readUserConfig reads dir's config.json, Version defaulted to 1 and
// DiskBytes measured.
func readUserConfig(dir string) (templates.UserRootFS, error) {
	u, _, err := readUserConfigLegacy(dir)
	return u, err
}

// legacyConfig is what a config.json written before versions were
// published one by one may hold besides a UserRootFS.
type legacyConfig struct {
	// Public: the template was published, every version of it. Only the
	// latest version's counts (installs copied it into every version).
	Public bool `json:"public"`
}

// readUserConfigLegacy is readUserConfig that also returns the config's
// legacy public flag.
func readUserConfigLegacy(dir string) (templates.UserRootFS, bool, error) {
	var u templates.UserRootFS
	b, err := os.ReadFile(filepath.Join(dir, userConfigFile))
	if err != nil {
		return u, false, err
	}
	var lc legacyConfig
	if err := json.Unmarshal(b, &u); err != nil {
		return u, false, err
	}
	json.Unmarshal(b, &lc) // cannot fail where the above did not
	if u.Version == 0 {
		u.Version = 1
	}
	var st unix.Stat_t
	if unix.Stat(filepath.Join(dir, "rootfs.ext4"), &st) == nil {
		u.DiskBytes = st.Blocks * 512
	}
	return u, lc.Public, nil
}

// readLatest reads user template name's latest version (through its
// link), a legacy public flag making it published.
func (s *Store) readLatest(name string) (templates.UserRootFS, error) {
	u, legacy, err := readUserConfigLegacy(filepath.Join(s.cfg.UserDir, name))
	u.Published = u.Published || legacy
	return u, err
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// userNames lists the user root filesystems.
func (s *Store) userNames() []string {
	if s.cfg.UserDir == "" {
		return nil
	}
	ents, _ := os.ReadDir(s.cfg.UserDir)
	var names []string
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 && templates.ValidName(e.Name()) && !s.IsBuiltin(e.Name()) &&
			fileExists(filepath.Join(s.cfg.UserDir, e.Name(), "rootfs.ext4")) {
			names = append(names, e.Name())
		}
	}
	return names
}

// UserRootFS returns the description of user root filesystem ref: its
// latest version ("NAME") or the version ref pins ("NAME:N"); ErrNotFound
// if there is none. Owner is the template's (its latest version's) either
// way; Published the version's own.
func (s *Store) UserRootFS(ref string) (templates.UserRootFS, error) {
	var u templates.UserRootFS
	name, v, err := templates.SplitRef(ref)
	if err != nil || s.cfg.UserDir == "" || s.IsBuiltin(name) {
		return u, fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	latest, err := s.readLatest(name)
	if errors.Is(err, os.ErrNotExist) {
		return u, fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	if err != nil {
		return u, fmt.Errorf("read user template %s: %w", name, err)
	}
	if v == 0 || v == latest.Version {
		return latest, nil
	}
	dir := s.versionDir(name, v)
	if dir == "" {
		return u, fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
	}
	u, err = readUserConfig(dir)
	if err != nil {
		return u, fmt.Errorf("read user template %s: %w", ref, err)
	}
	u.Owner = latest.Owner
	return u, nil
}

// UserVersions lists the versions of user template name, oldest first
// (ErrNotFound if there is none). Owner is the template's; Published each
// version's own.
func (s *Store) UserVersions(name string) ([]templates.UserRootFS, error) {
	latest, err := s.UserRootFS(name)
	if err != nil {
		return nil, err
	}
	var out []templates.UserRootFS
	for _, d := range s.versionDirs(name) {
		if d.u.Version > latest.Version {
			continue // an install interrupted before its link
		}
		if d.u.Version == latest.Version {
			d.u = latest // its legacy flag counted
		}
		d.u.Owner = latest.Owner
		out = append(out, d.u)
	}
	if len(out) == 0 || out[len(out)-1].Version != latest.Version {
		out = append(out, latest) // cannot happen but through a hand-made link
	}
	return out, nil
}

// UserRootFSes lists the user root filesystems, by name.
func (s *Store) UserRootFSes() ([]templates.UserRootFS, error) {
	var out []templates.UserRootFS
	for _, name := range s.userNames() {
		u, err := s.UserRootFS(name)
		if errors.Is(err, templates.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// StageUserRootFS makes a new, empty version directory for user root
// filesystem name, in which the caller writes rootfs.ext4 before passing
// it to InstallUserRootFS (or removing it). It is on the same file system
// as the installed versions.
func (s *Store) StageUserRootFS(name string) (string, error) {
	if s.cfg.UserDir == "" {
		return "", fmt.Errorf("%w: this host keeps no user templates", templates.ErrInvalid)
	}
	if err := s.ValidateUserName(name); err != nil {
		return "", err
	}
	if err := os.MkdirAll(s.cfg.UserDir, 0o700); err != nil {
		return "", fmt.Errorf("stage user template %s: %w", name, err)
	}
	dir, err := os.MkdirTemp(s.cfg.UserDir, ".v-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("stage user template %s: %w", name, err)
	}
	return dir, nil
}

// InstallUserRootFS makes dir (from StageUserRootFS, holding rootfs.ext4)
// the latest version of user root filesystem u.Name, atomically: version
// one more than the highest installed (or u.Version if set, which must be
// higher: ErrConflict), with the Owner of the version it follows (u's own
// when it is the first), not published (whatever u says). The versions
// before it are kept, published or not. Callers serialize installs and
// removals of one name.
func (s *Store) InstallUserRootFS(dir string, u templates.UserRootFS) error {
	_, err := s.installUser(dir, u)
	return err
}

// TryUserRootFS is InstallUserRootFS with a way back: keep leaves the new
// version installed; undo makes the version it followed the latest again
// (or, if there was none, removes name and the shapes baked from dir's
// version, like RemoveUserRootFS) and removes dir's version, whose number
// the next install takes again. Call exactly one of them, with installs
// and removals of the name still serialized.
func (s *Store) TryUserRootFS(dir string, u templates.UserRootFS) (keep func(), undo func() error, err error) {
	last := s.lastVersion(u.Name)
	old, err := s.installUser(dir, u)
	if err != nil {
		return nil, nil, err
	}
	keep = func() {}
	undo = func() error {
		defer func() {
			s.userMu.Lock()
			s.setLastVersion(u.Name, last, true)
			s.userMu.Unlock()
		}()
		if old == "" {
			return s.RemoveUserRootFS(u.Name)
		}
		s.userMu.Lock()
		defer s.userMu.Unlock()
		if err := s.pointUser(u.Name, old); err != nil {
			return fmt.Errorf("restore user template %s: %w", u.Name, err)
		}
		if nu, err := readUserConfig(dir); err == nil {
			s.removeBaked(func(t Template) bool { return t.Name == templates.Ref(u.Name, nu.Version) })
		}
		s.removeVersion(filepath.Base(dir))
		return nil
	}
	return keep, undo, nil
}

// removeVersion removes version directory v of UserDir ("" for none).
func (s *Store) removeVersion(v string) {
	if v != "" && !strings.Contains(v, "/") && strings.HasPrefix(v, ".v-") {
		os.RemoveAll(filepath.Join(s.cfg.UserDir, v))
	}
}

// pointUser makes name point to version directory v, atomically.
func (s *Store) pointUser(name, v string) error {
	link := filepath.Join(s.cfg.UserDir, name)
	tmp := filepath.Join(s.cfg.UserDir, ".link-"+name+"-"+randHex(4))
	if err := os.Symlink(v, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, link); err != nil {
		os.Remove(tmp)
		return err
	}
	syncPath(s.cfg.UserDir)
	return nil
}

// installUser makes dir the latest version of u.Name and returns the
// version directory it follows ("" if none), which it leaves in place.
func (s *Store) installUser(dir string, u templates.UserRootFS) (old string, err error) {
	if err := s.ValidateUserName(u.Name); err != nil {
		return "", err
	}
	if filepath.Dir(dir) != filepath.Clean(s.cfg.UserDir) || !strings.HasPrefix(filepath.Base(dir), ".v-"+u.Name+"-") {
		return "", fmt.Errorf("install user template %s: %s is not one of its staged versions", u.Name, dir)
	}
	img := filepath.Join(dir, "rootfs.ext4")
	st, err := os.Stat(img)
	if err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	old, _ = os.Readlink(filepath.Join(s.cfg.UserDir, u.Name))
	if old == filepath.Base(dir) {
		return "", fmt.Errorf("install user template %s: %s is installed already", u.Name, dir)
	}
	// Before the link moves: a legacy flag is the latest version's.
	if err := s.settleLegacyPublic(u.Name); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	want := u.Version
	u.Version, u.Published = 1, false
	if prev, err := readUserConfig(filepath.Join(s.cfg.UserDir, u.Name)); err == nil {
		u.Version, u.Owner = prev.Version+1, prev.Owner
	} else {
		old = "" // a dangling link: nothing to carry over or go back to
	}
	u.Version = max(u.Version, s.lastVersion(u.Name)+1)
	if want > 0 {
		// A number given by a fleet's registry: it must be new here too.
		if want < u.Version {
			return "", fmt.Errorf("%w: install user template %s as version %d: this host has had version %d", templates.ErrConflict, u.Name, want, u.Version-1)
		}
		u.Version, u.Copy = want, true
	}
	for _, d := range s.versionDirs(u.Name) {
		if d.u.Version >= u.Version && d.dir != dir {
			// An install interrupted before its link: never a version.
			os.RemoveAll(d.dir)
		}
	}
	u.SizeBytes = st.Size()
	if err := writeVersion(dir, u); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	// The number first: a crash before the link wastes it, never reuses it.
	if err := s.setLastVersion(u.Name, u.Version, false); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	if err := s.pointUser(u.Name, filepath.Base(dir)); err != nil {
		return "", fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	return old, nil
}

// InstallUserReplica installs dir (from StageUserRootFS, holding
// rootfs.ext4) as version u.Version of user template u.Name, a copy of a
// version another host built, with u's description as it is: the latest
// version if it is newer than every one installed, one of the older ones
// otherwise. If that version is installed already, dir is removed and
// nothing changes: a version's bytes never change.
func (s *Store) InstallUserReplica(dir string, u templates.UserRootFS) error {
	if err := s.ValidateUserName(u.Name); err != nil {
		return err
	}
	if u.Version < 1 {
		return fmt.Errorf("%w: a copy of template %s needs its version", templates.ErrInvalid, u.Name)
	}
	if filepath.Dir(dir) != filepath.Clean(s.cfg.UserDir) || !strings.HasPrefix(filepath.Base(dir), ".v-"+u.Name+"-") {
		return fmt.Errorf("install user template %s: %s is not one of its staged versions", u.Name, dir)
	}
	st, err := os.Stat(filepath.Join(dir, "rootfs.ext4"))
	if err != nil {
		return fmt.Errorf("install user template %s: %w", u.Name, err)
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	latest, lerr := readUserConfig(filepath.Join(s.cfg.UserDir, u.Name))
	if (lerr == nil && latest.Version == u.Version) || s.versionDir(u.Name, u.Version) != "" {
		os.RemoveAll(dir)
		return nil
	}
	u.SizeBytes, u.Copy = st.Size(), true
	if err := writeVersion(dir, u); err != nil {
		return fmt.Errorf("install user template %s: %w", templates.Ref(u.Name, u.Version), err)
	}
	if err := s.setLastVersion(u.Name, u.Version, false); err != nil {
		return fmt.Errorf("install user template %s: %w", templates.Ref(u.Name, u.Version), err)
	}
	if lerr != nil || latest.Version < u.Version {
		if err := s.pointUser(u.Name, filepath.Base(dir)); err != nil {
			return fmt.Errorf("install user template %s: %w", templates.Ref(u.Name, u.Version), err)
		}
	}
	return nil
}

// writeVersion writes u as version directory dir's config.json and
// flushes it, the root filesystem and the directory to stable storage.
func writeVersion(dir string, u templates.UserRootFS) error {
	u.DiskBytes = 0
	b, _ := json.MarshalIndent(u, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, userConfigFile), b, 0o600); err != nil {
		return err
	}
	for _, p := range []string{filepath.Join(dir, "rootfs.ext4"), filepath.Join(dir, userConfigFile), dir} {
		if err := syncPath(p); err != nil {
			return err
		}
	}
	return nil
}

// lastVersionFile keeps the highest version user template name ever had.
func (s *Store) lastVersionFile(name string) string {
	return filepath.Join(s.cfg.UserDir, ".last-"+name)
}

// lastVersion is the highest version user template name ever had (0:
// none, or never recorded).
func (s *Store) lastVersion(name string) int {
	b, err := os.ReadFile(s.lastVersionFile(name))
	if err != nil {
		return 0
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// setLastVersion records v as the highest version of name, if it is
// higher than the recorded one (or, with lower, whatever it is). Called
// with userMu held.
func (s *Store) setLastVersion(name string, v int, lower bool) error {
	if !lower && v <= s.lastVersion(name) {
		return nil
	}
	p := s.lastVersionFile(name)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(v)+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncPath(s.cfg.UserDir)
}

// SetUserPublished publishes (or withdraws) versions of user template
// ref: "NAME:N" version N alone; "NAME" its latest version when
// publishing, every version when withdrawing. Other versions keep their
// flags. ErrNotFound if there is no such template or version.
func (s *Store) SetUserPublished(ref string, published bool) error {
	name, v, err := templates.SplitRef(ref)
	if err != nil || s.cfg.UserDir == "" || s.IsBuiltin(name) {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	if err := s.settleLegacyPublic(name); err != nil {
		return fmt.Errorf("publish user template %s: %w", ref, err)
	}
	latest, err := s.readLatest(name)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, name)
	}
	if err != nil {
		return fmt.Errorf("read user template %s: %w", name, err)
	}
	var dirs []string // the version directories to change
	switch {
	case v == 0 && published, v == latest.Version:
		target, err := os.Readlink(filepath.Join(s.cfg.UserDir, name))
		if err != nil {
			return fmt.Errorf("publish user template %s: %w", ref, err)
		}
		dirs = []string{filepath.Join(s.cfg.UserDir, target)}
	case v == 0:
		for _, d := range s.versionDirs(name) {
			if d.u.Version <= latest.Version {
				dirs = append(dirs, d.dir)
			}
		}
	default:
		dir := s.versionDir(name, v)
		if dir == "" || v > latest.Version {
			return fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
		}
		dirs = []string{dir}
	}
	for _, dir := range dirs {
		u, err := readUserConfig(dir)
		if err != nil {
			return fmt.Errorf("publish user template %s: %w", ref, err)
		}
		if u.Published == published {
			continue
		}
		u.Published = published
		if err := rewriteConfig(dir, u); err != nil {
			return fmt.Errorf("publish user template %s: %w", ref, err)
		}
	}
	return nil
}

// settleLegacyPublic rewrites the configs of user template name that hold
// a legacy public flag (legacyConfig): the latest version's as published,
// the others' without it (installs had copied it into them). Called with
// userMu held, before anything changes which version is the latest or
// which are published.
func (s *Store) settleLegacyPublic(name string) error {
	target, err := os.Readlink(filepath.Join(s.cfg.UserDir, name))
	if err != nil {
		return nil // no template: nothing to settle
	}
	if _, legacy, err := readUserConfigLegacy(filepath.Join(s.cfg.UserDir, target)); err != nil || !legacy {
		return nil // settled already (or unreadable: the caller finds out)
	}
	// The others first: a crash midway leaves the latest's flag to redo it.
	for _, d := range s.versionDirs(name) {
		if filepath.Base(d.dir) == target {
			continue
		}
		if _, legacy, err := readUserConfigLegacy(d.dir); err == nil && legacy {
			if err := rewriteConfig(d.dir, d.u); err != nil {
				return err
			}
		}
	}
	dir := filepath.Join(s.cfg.UserDir, target)
	u, err := readUserConfig(dir)
	if err != nil {
		return err
	}
	u.Published = true
	return rewriteConfig(dir, u)
}

// rewriteConfig replaces version directory dir's config.json with u,
// atomically (legacy fields dropped).
func rewriteConfig(dir string, u templates.UserRootFS) error {
	u.DiskBytes = 0
	b, _ := json.MarshalIndent(u, "", "  ")
	tmp := filepath.Join(dir, userConfigFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	syncPath(tmp)
	if err := os.Rename(tmp, filepath.Join(dir, userConfigFile)); err != nil {
		os.Remove(tmp)
		return err
	}
	return syncPath(dir)
}

// RemoveUserRootFS removes every version of user root filesystem name and
// every template baked from them (ErrNotFound if there is none). Sandboxes
// restored from those templates keep running: they hold their own files.
func (s *Store) RemoveUserRootFS(name string) error {
	if strings.Contains(name, ":") {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, name)
	}
	if _, err := s.UserRootFS(name); err != nil {
		return err
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	link := filepath.Join(s.cfg.UserDir, name)
	target, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("remove user template %s: %w", name, err)
	}
	if err := os.Remove(link); err != nil {
		return fmt.Errorf("remove user template %s: %w", name, err)
	}
	syncPath(s.cfg.UserDir)
	s.removeVersion(target)
	for _, d := range s.versionDirs(name) {
		s.removeVersion(filepath.Base(d.dir))
	}
	s.removeBaked(func(t Template) bool {
		n, _, _ := strings.Cut(t.Name, ":")
		return n == name
	})
	return nil
}

// RemoveUserVersion removes version v of user template name and the
// templates baked from it (ErrNotFound if there is none). The latest
// version is refused (ErrConflict): remove the template, or build a newer
// version first.
func (s *Store) RemoveUserVersion(name string, v int) error {
	latest, err := s.UserRootFS(name)
	if err != nil {
		return err
	}
	if v == latest.Version {
		return fmt.Errorf("%w: version %d is the latest of template %s; delete the whole template, or build a newer version first", templates.ErrConflict, v, name)
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	dir := s.versionDir(name, v)
	if dir == "" || v > latest.Version {
		return fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
	}
	// Its config first: a crash midway leaves no half a version listed.
	if err := os.Remove(filepath.Join(dir, userConfigFile)); err != nil {
		return fmt.Errorf("remove version %d of template %s: %w", v, name, err)
	}
	s.removeVersion(filepath.Base(dir))
	ref := templates.Ref(name, v)
	s.removeBaked(func(t Template) bool { return t.Name == ref })
	return nil
}

// RemoveUserCopy is RemoveUserVersion on a host of a fleet, whose user
// templates are copies of the versions the fleet's registry (the catalog)
// lists: the latest version is removed too, the highest one left
// becoming the latest (if none is left, the template is removed).
func (s *Store) RemoveUserCopy(name string, v int) error {
	latest, err := s.UserRootFS(name)
	if err != nil {
		return err
	}
	if v != latest.Version {
		return s.RemoveUserVersion(name, v)
	}
	s.userMu.Lock()
	next := ""
	for _, d := range s.versionDirs(name) {
		if d.u.Version < v {
			next = d.dir // by version: the last one below v
		}
	}
	s.userMu.Unlock()
	if next == "" {
		return s.RemoveUserRootFS(name)
	}
	s.userMu.Lock()
	defer s.userMu.Unlock()
	target, err := os.Readlink(filepath.Join(s.cfg.UserDir, name))
	if err != nil {
		return fmt.Errorf("remove version %d of template %s: %w", v, name, err)
	}
	if err := s.pointUser(name, filepath.Base(next)); err != nil {
		return fmt.Errorf("remove version %d of template %s: %w", v, name, err)
	}
	s.removeVersion(target)
	ref := templates.Ref(name, v)
	s.removeBaked(func(t Template) bool { return t.Name == ref })
	return nil
}

// removeBaked removes the baked templates for which match is true.
func (s *Store) removeBaked(match func(Template) bool) {
	baked, err := s.List()
	if err != nil {
		return
	}
	for _, t := range baked {
		if !match(t) {
			continue
		}
		// Aside first, like a re-bake: a Lookup sees the template whole
		// or not at all.
		old := filepath.Join(s.cfg.Dir, ".old-"+t.Key()+"-"+randHex(4))
		if err := os.Rename(t.Dir, old); err == nil {
			os.RemoveAll(old)
		}
	}
}

// removeUserLeftovers removes what interrupted builds and installs left
// (staged directories never installed, versions installed but never
// linked, stray links) and returns how many.
func (s *Store) removeUserLeftovers() int {
	if s.cfg.UserDir == "" {
		return 0
	}
	live := map[string]bool{}
	latest := map[string]int{}
	ents, _ := os.ReadDir(s.cfg.UserDir)
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			if t, err := os.Readlink(filepath.Join(s.cfg.UserDir, e.Name())); err == nil {
				live[t] = true
				if u, err := readUserConfig(filepath.Join(s.cfg.UserDir, e.Name())); err == nil {
					latest[e.Name()] = u.Version
				}
			}
		}
	}
	var n int
	for _, e := range ents {
		name := e.Name()
		stray := strings.HasPrefix(name, ".link-")
		if strings.HasPrefix(name, ".v-") && !live[name] {
			u, err := readUserConfig(filepath.Join(s.cfg.UserDir, name))
			// An older version of a template that has a latest one is kept.
			stray = err != nil || latest[u.Name] == 0 || u.Version >= latest[u.Name]
		}
		if stray && os.RemoveAll(filepath.Join(s.cfg.UserDir, name)) == nil {
			n++
		}
	}
	return n
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// mergeNames returns the sorted union of a and b.
func mergeNames(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range append(append([]string(nil), a...), b...) {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
