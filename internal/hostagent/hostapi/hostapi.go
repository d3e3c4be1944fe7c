// Package hostapi is the host agent's side of the host RPC: NewServer
// serves one hostagent.Agent under /host/v1 to the control plane (`panda
// server`), whose client is internal/controlplane/hostclient. The wire
// format both share is internal/contract/hostwire's; its package
// documentation describes the protocol.
//
// Transport and credentials: the agent serves the API over TLS 1.3
// (HTTP/1.1) with a certificate signed by a CA of its own, made on first
// start (LoadOrCreateTLS, AgentTLS), and accepts its own token
// (LoadOrCreateToken): every request but GET /healthz carries
// `Authorization: Bearer <agent token>`, compared in constant time, or a
// pack ticket for one snapshot's pack (hostwire.PackTicket). Each agent has
// its own CA, certificate and token.
//
// One call goes from a host agent to another: a pack pull (POST
// …/snapshots/{id}/pack/pull) fetches the pack straight from the agent
// that holds it (pull.go), with the small client it needs here, since host
// code does not reach control-plane code.
package hostapi
