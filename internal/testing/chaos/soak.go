package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sample is one measurement of a panda process during a soak.
type Sample struct {
	AtSeconds float64 `json:"at_seconds"` // since the soak started
	Role      string  `json:"role"`       // server (panda up or panda server) or agent
	PID       int     `json:"pid"`
	RSSBytes  int64   `json:"rss_bytes"`
	FDs       int     `json:"fds"`
	// Goroutines is the server's go_goroutines metric (-1 for the agent,
	// which has no metrics endpoint, or if it could not be read).
	Goroutines int `json:"goroutines"`
}

// SoakReport is the samples of a soak and whether they stayed flat.
type SoakReport struct {
	Samples []Sample `json:"samples"`
	Flat    bool     `json:"flat"`
	Verdict string   `json:"verdict"`
}

// Flatness: after a warm-up (the first sixth of the samples, at least
// one), the samples are cut in thirds; a measure is flat if the highest
// value of the last third is at most flatRatio times the highest of the
// first third plus an absolute slack (a few MiB of heap, a few files or
// goroutines come and go with the load of the moment).
const (
	flatRatio      = 1.2
	rssSlack       = 16 << 20
	fdSlack        = 16
	goroutineSlack = 32
	minFlatSamples = 3
)

// Flat judges a series of values (in time order) by the rule above; why
// says how it judged.
func Flat(values []float64, slack float64) (flat bool, why string) {
	warm := max(1, len(values)/6)
	if len(values)-warm < minFlatSamples {
		return true, fmt.Sprintf("%d samples after warm-up, too few to judge", max(0, len(values)-warm))
	}
	v := values[warm:]
	third := len(v) / 3
	first, last := maxOf(v[:third]), maxOf(v[len(v)-third:])
	limit := first*flatRatio + slack
	if last > limit {
		return false, fmt.Sprintf("grew from at most %.0f to %.0f (limit %.0f)", first, last, limit)
	}
	return true, fmt.Sprintf("at most %.0f early, %.0f late (limit %.0f)", first, last, limit)
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

// soaker samples the deployment's processes during a soak.
type soaker struct {
	r     *runner
	start time.Time
	last  time.Time
	samps []Sample
}

func newSoaker(r *runner) *soaker { return &soaker{r: r, start: time.Now()} }

func (s *soaker) due() bool { return time.Since(s.last) >= s.r.cfg.SampleEvery }

// sample measures every process of the deployment now.
func (s *soaker) sample(ctx context.Context) {
	s.last = time.Now()
	for _, role := range s.r.cl.roles() {
		pid := s.r.cl.pid(role)
		if pid == 0 {
			continue
		}
		smp := Sample{AtSeconds: time.Since(s.start).Seconds(), Role: role, PID: pid, RSSBytes: rss(pid), FDs: fds(pid), Goroutines: -1}
		if role == roleServer {
			smp.Goroutines = s.goroutines(ctx)
		}
		s.samps = append(s.samps, smp)
		fmt.Fprintf(s.r.cfg.Log, "soak %s: rss %.1f MiB, %d fds, %d goroutines\n", role, float64(smp.RSSBytes)/(1<<20), smp.FDs, smp.Goroutines)
	}
}

// report judges the samples: each measure of each process must be flat,
// and each process must be the one the soak started with (a restart would
// hide a leak).
func (s *soaker) report() *SoakReport {
	rep := &SoakReport{Samples: s.samps, Flat: true}
	var verdicts []string
	for _, role := range s.r.cl.roles() {
		var rssV, fdV, grV []float64
		pids := map[int]bool{}
		for _, smp := range s.samps {
			if smp.Role != role {
				continue
			}
			pids[smp.PID] = true
			rssV = append(rssV, float64(smp.RSSBytes))
			fdV = append(fdV, float64(smp.FDs))
			if smp.Goroutines >= 0 {
				grV = append(grV, float64(smp.Goroutines))
			}
		}
		if len(pids) > 1 {
			rep.Flat = false
			verdicts = append(verdicts, fmt.Sprintf("%s: restarted during the soak (pids %v)", role, pids))
		}
		for _, m := range []struct {
			name  string
			v     []float64
			slack float64
		}{{"rss bytes", rssV, rssSlack}, {"fds", fdV, fdSlack}, {"goroutines", grV, goroutineSlack}} {
			if len(m.v) == 0 {
				continue
			}
			flat, why := Flat(m.v, m.slack)
			rep.Flat = rep.Flat && flat
			verdicts = append(verdicts, fmt.Sprintf("%s %s: %s", role, m.name, why))
		}
	}
	rep.Verdict = strings.Join(verdicts, "; ")
	return rep
}

func (s *SoakReport) writeText(w io.Writer) {
	word := "flat"
	if !s.Flat {
		word = "NOT flat"
	}
	fmt.Fprintf(w, "soak: %d samples, %s: %s\n", len(s.Samples), word, s.Verdict)
	for _, smp := range s.Samples {
		fmt.Fprintf(w, "  %6.0fs %-6s rss %7.1f MiB  fds %4d  goroutines %4d\n", smp.AtSeconds, smp.Role, float64(smp.RSSBytes)/(1<<20), smp.FDs, smp.Goroutines)
	}
}

// goroutines reads go_goroutines from the server's /metrics (admin key).
func (s *soaker) goroutines(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.r.cl.addr+"/metrics", nil)
	if err != nil {
		return -1
	}
	req.Header.Set("Authorization", "Bearer "+s.r.cl.adminKey)
	resp, err := s.r.cl.hc.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return -1
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			if n, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return int(n)
			}
		}
	}
	return -1
}

// rss is a process's resident set size (VmRSS), 0 if unknown.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kib, _ := strconv.ParseInt(f[0], 10, 64)
				return kib << 10
			}
		}
	}
	return 0
}

// fds is how many files a process has open.
func fds(pid int) int {
	ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents)
}
