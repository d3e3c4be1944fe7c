package build

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
)

// On disk, with Config.Dir, build ID is
//
//	Dir/ID.json   its record (status and owner), replaced whole at each change
//	Dir/ID.log    its progress lines, one a line, appended as they come
//
// A record is written when the build is queued, when it starts running and
// when it ends; its lines are as bounded as in memory (Config.MaxLines,
// MaxLineBytes). Neither file is fsynced but at the end: a crash may lose
// a line, and a record lost at start-up makes a build unknown (404).

// record is a build's ID.json.
type record struct {
	builds.Status
	Owner   string `json:"owner,omitempty"`
	Dropped int    `json:"dropped,omitempty"`
}

// load reads the builds of Config.Dir, failing those that were queued or
// running (CodeInterrupted) and forgetting those past Retention.
func (m *Manager) load() error {
	if m.cfg.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	ents, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !builds.ValidID(id) {
			if strings.HasSuffix(e.Name(), ".tmp") {
				os.Remove(filepath.Join(m.cfg.Dir, e.Name()))
			}
			continue
		}
		var rec record
		b, err := os.ReadFile(filepath.Join(m.cfg.Dir, e.Name()))
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.ID != id {
			m.cfg.Logger.Warn("unreadable template build record removed", "build_id", id, "err", err)
			m.removeFiles(id)
			continue
		}
		bd := &build{st: rec.Status, dropped: rec.Dropped, changed: make(chan struct{}), cancel: func() {}}
		bd.st.Owner = rec.Owner
		bd.lines = m.readLines(id)
		if !bd.st.Done() {
			now := time.Now().UTC()
			bd.st.State, bd.st.EndedAt = builds.StateFailed, &now
			bd.st.Code, bd.st.Error = builds.CodeInterrupted, "the server restarted during the build; start it again"
			m.save(bd)
		}
		m.builds[id] = bd
	}
	m.prune()
	// Logs without a record: a crash between the two writes.
	logs, _ := filepath.Glob(filepath.Join(m.cfg.Dir, "*.log"))
	for _, p := range logs {
		if _, ok := m.builds[strings.TrimSuffix(filepath.Base(p), ".log")]; !ok {
			os.Remove(p)
		}
	}
	return nil
}

func (m *Manager) readLines(id string) []string {
	f, err := os.Open(filepath.Join(m.cfg.Dir, id+".log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4*MaxLineBytes)
	for sc.Scan() && len(lines) < m.cfg.MaxLines {
		lines = append(lines, sc.Text())
	}
	return lines
}

// create writes a new build's record and opens its log; m.mu is held.
func (m *Manager) create(b *build) error {
	if m.cfg.Dir == "" {
		return nil
	}
	if err := m.writeRecord(b); err != nil {
		return fmt.Errorf("record template build: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(m.cfg.Dir, b.st.ID+".log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		m.removeFiles(b.st.ID)
		return fmt.Errorf("record template build: %w", err)
	}
	b.log = f
	return nil
}

// save rewrites b's record; m.mu is held. A failure is logged: the build
// goes on (its status in memory is right).
func (m *Manager) save(b *build) {
	if m.cfg.Dir == "" {
		return
	}
	if b.st.Done() && b.log != nil {
		b.log.Sync()
	}
	if err := m.writeRecord(b); err != nil {
		m.cfg.Logger.Error("record template build", "build_id", b.st.ID, "err", err)
	}
}

func (m *Manager) writeRecord(b *build) error {
	data, _ := json.Marshal(record{Status: b.st, Owner: b.st.Owner, Dropped: b.dropped})
	p := filepath.Join(m.cfg.Dir, b.st.ID+".json")
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && b.st.Done() {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// appendLine appends line to b's log; m.mu is held.
func (m *Manager) appendLine(b *build, line string) {
	if b.log == nil {
		return
	}
	line = strings.ReplaceAll(line, "\n", " ")
	if _, err := b.log.WriteString(line + "\n"); err != nil {
		m.cfg.Logger.Error("record template build log", "build_id", b.st.ID, "err", err)
		b.log.Close()
		b.log = nil
	}
}

func (m *Manager) removeFiles(id string) {
	if m.cfg.Dir == "" || !builds.ValidID(id) {
		return
	}
	for _, ext := range []string{".json", ".log"} {
		if err := os.Remove(filepath.Join(m.cfg.Dir, id+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.cfg.Logger.Warn("remove template build file", "build_id", id, "err", err)
		}
	}
}
