package rest

import (
	"context"
	"net/http"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the API's own; the control plane registers its own
// (creates, forks, snapshots, pauses, expiries) with the same registry.
type metrics struct {
	reg         prometheus.Gatherer
	execSeconds prometheus.Histogram
	bakes       *prometheus.CounterVec
}

var latencyBuckets = []float64{.025, .05, .075, .1, .15, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &metrics{
		execSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "panda_exec_seconds", Help: "Duration of exec requests, start to exit.", Buckets: latencyBuckets}),
		bakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "panda_template_bakes_total", Help: "Template bakes requested through the API, by result."}, []string{"result"}),
	}
	byState := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_running", Help: "Sandboxes running."},
		func() float64 { return s.countState(catalog.StateRunning) })
	byStatePaused := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_paused", Help: "Sandboxes paused."},
		func() float64 { return s.countState(catalog.StatePaused) })
	byStateStarting := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_sandboxes_starting", Help: "Sandboxes starting."},
		func() float64 { return s.countState(catalog.StateStarting) })
	proxyConns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "panda_proxy_guest_connections",
		Help: "Connections the port proxy holds open to guests (in use and idle)."},
		func() float64 { return float64(s.proxy.open()) })
	for _, c := range []prometheus.Collector{m.execSeconds, m.bakes, byState, byStatePaused, byStateStarting, proxyConns} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"ok", "error"} {
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
	list, err := s.cat.ListSandboxes(context.Background(), catalog.SandboxFilter{States: []string{state}, HostID: s.cp.Config().HostID})
	if err != nil {
		return 0
	}
	return float64(len(list))
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
