// Package hostapi serves the host RPC: NewServer exposes one
// hostagent.Agent under /host/v1 to the control plane (`panda server`),
// over TLS 1.3 with the agent's own CA and certificate (LoadOrCreateTLS)
// and token (LoadOrCreateToken). The wire format, which both sides share,
// is internal/contract/hostwire's; its package documentation describes
// the protocol.
package hostapi
