package host

// What a host agent tells the control plane it joins (`panda agent
// --server URL --token T`): internal/controlplane/fleet keeps it; the REST API carries
// it (POST /v1/fleet/join and /v1/fleet/hosts/{id}/heartbeat).

// Registration is a host agent joining the control plane: how to reach it
// and what it offers.
type Registration struct {
	// ID names the host (1-63 of [a-z0-9-], starting with a letter or a
	// digit); an agent keeps it in its data directory across restarts.
	ID string `json:"id"`
	// URL is the agent's host API as the control plane reaches it
	// (https://HOST:PORT).
	URL string `json:"url"`
	// Token is the agent's own host API token, and CACert (PEM) the CA
	// of its TLS certificate: the control plane's credentials for it. A
	// host that registers again under its id must present the same token.
	Token    string   `json:"token"`
	CACert   string   `json:"ca_cert"`
	Capacity Capacity `json:"capacity"`
	Load     Load     `json:"load"`
}

// Capacity is what a host offers.
type Capacity struct {
	CPUs      int    `json:"cpus"`
	MemoryMiB int64  `json:"memory_mib"`
	DiskMiB   int64  `json:"disk_mib"`
	Accel     string `json:"accel"`
}

// Load is a host's state as its heartbeats report it.
type Load struct {
	FreeMemoryMiB int64 `json:"free_memory_mib"`
	DiskFreeMiB   int64 `json:"disk_free_mib"`
	// Sandboxes is how many the host runs or holds paused.
	Sandboxes int `json:"sandboxes"`
	// Templates are the templates whose memory image the host holds
	// (names as creates give them: "base", "NAME:V").
	Templates []string `json:"templates"`
}

// ValidHostID reports whether id can name a host.
func ValidHostID(id string) bool {
	if id == "" || len(id) > 63 || id[0] == '-' {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
