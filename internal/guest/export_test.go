package guest

// MapHostname exposes SetHostname's /etc/hosts step to the tests, which
// must not set the host's hostname.
func (h SystemHooks) MapHostname(name string) error { return h.mapHostname(name) }
