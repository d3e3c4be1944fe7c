package hostapi

import "time"

// SetCertValidity makes the serving certificates issued from now on valid
// for d, until the returned function restores the default.
func SetCertValidity(d time.Duration) (restore func()) {
	old := certValidity
	certValidity = d
	return func() { certValidity = old }
}
