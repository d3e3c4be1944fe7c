package api

import (
	"context"
	"net/http"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

type metrics struct {
	reg              prometheus.Gatherer
	createSeconds    prometheus.Histogram
	execSeconds      prometheus.Histogram
	creates          *prometheus.CounterVec
	bakes            *prometheus.CounterVec
	expired          prometheus.Counter
	forks            prometheus.Counter
	forkPauseSeconds prometheus.Histogram
	snapshots        prometheus.Counter
	pauses           prometheus.Counter
}

var latencyBuckets = []float64{.025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "panda_sandbox_create_seconds", Help: "Time to create a sandbox until its guest agent answers.", Buckets: latencyBuckets}),
		execSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "panda_exec_seconds", Help: "Duration of exec requests, start to exit.", Buckets: latencyBuckets}),
		creates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "panda_sandbox_creates_total", Help: "Sandbox creates by result."}, []string{"result"}),
		bakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "panda_template_bakes_total", Help: "Template bakes requested through the API, by result."}, []string{"result"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "panda_sandbox_expired_total", Help: "Sandboxes stopped because their TTL ran out."}),
	}
	m.forks = prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_forks_total", Help: "Fork requests that captured their parent."})
	m.forkPauseSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "panda_fork_parent_pause_seconds", Help: "How long a fork kept its parent's vCPUs stopped.",
		Buckets: []float64{.005, .01, .025, .05, .075, .1, .15, .25, .5, 1}})
	m.snapshots = prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_snapshots_total", Help: "Snapshots taken."})
	m.pauses = prometheus.NewCounter(prometheus.CounterOpts{Name: "panda_pauses_total", Help: "Sandboxes paused."})
	byState := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_running", Help: "Sandboxes running."},
		func() float64 { return s.countState(catalog.StateRunning) })
	byStatePaused := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_paused", Help: "Sandboxes paused."},
		func() float64 { return s.countState(catalog.StatePaused) })
	byStateStarting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_starting", Help: "Sandboxes starting."},
		func() float64 { return s.countState(catalog.StateStarting) })
	proxyConns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_proxy_guest_connections",
		Help: "Connections the port proxy holds open to guests (in use and idle)."},
		func() float64 { return float64(s.proxy.open()) })
	for _, c := range []prometheus.Collector{m.createSeconds, m.execSeconds, m.creates, m.bakes, m.expired,
		m.forks, m.forkPauseSeconds, m.snapshots, m.pauses, byState, byStatePaused, byStateStarting, proxyConns} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"ok", "error"} {
		m.creates.WithLabelValues(r)
		m.bakes.WithLabelValues(r)
	}
	if g, ok := reg.(prometheus.Gatherer); ok {
		m.reg = g
	} else {
		m.reg = prometheus.DefaultGatherer
	}
	return m, nil
}

func (s *Server) countState(state string) float64 {
	list, err := s.cat.ListSandboxes(context.Background(), catalog.SandboxFilter{States: []string{state}, HostID: s.cfg.HostID})
	if err != nil {
		return 0
	}
	return float64(len(list))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
