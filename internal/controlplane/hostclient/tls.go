package hostclient

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ClientTLS is the TLS configuration with which the control plane talks to
// the agent whose CA certificate is in caFile: it trusts that CA only.
func ClientTLS(caFile string) (*tls.Config, error) {
	b, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read agent CA: %w", err)
	}
	c, err := ClientTLSFromPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%w in %s", err, caFile)
	}
	return c, nil
}

// ClientTLSFromPEM is ClientTLS for the agent whose CA certificate is
// caPEM (as `panda agent --server` sends it when it registers).
func ClientTLSFromPEM(caPEM []byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("read agent CA: no PEM certificate")
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}
