package rest_test

import (
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/prometheus/client_golang/prometheus"
)

// newServer builds a control plane over cat and the one host h (or the
// fleet cfg.Fleet, whose router h is) as pcfg says and the API over it,
// as `panda up` and `panda server` do (cmd/panda/internal/daemon).
func newServer(cfg rest.Config, pcfg controlplane.Config, cat catalog.Catalog, h host.Host) (*rest.Server, *controlplane.Plane, error) {
	reg := prometheus.NewRegistry()
	if pcfg.Logger == nil {
		pcfg.Logger = cfg.Logger
	}
	var cp *controlplane.Plane
	var err error
	if cfg.Fleet != nil {
		cp, err = controlplane.NewFleet(pcfg, cat, cfg.Fleet, reg)
	} else {
		cp, err = controlplane.New(pcfg, cat, h, reg)
	}
	if err != nil {
		return nil, nil, err
	}
	srv, err := rest.New(cfg, cp, cat, h, reg)
	if err != nil {
		return nil, nil, err
	}
	return srv, cp, nil
}
