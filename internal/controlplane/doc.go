// Package control is PandaStack's control plane without HTTP: Plane, over
// a catalog.Catalog and a host.Host, owns the sandboxes' lifecycle as users
// see it (create with its quota, kill, TTLs and the expiry loop, network
// policies, fork, snapshots, pause and resume run detached from requests,
// reconciling the catalog with the host), and the one error vocabulary the
// REST API and the E2B API answer with (Kind, Error and Classify: a kind, a
// message written for users and the internal cause, which is logged and
// never shown). The HTTP layers (internal/controlplane/rest, and internal/controlplane/e2b through
// api's adapter) decode requests, call Plane and map kinds to statuses.
package controlplane
