package hostapi_test

// Tests of the agent's TLS credentials and of the client's trust in them.
// They need no VM but the one of hostapi_test.go for the handler.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func leafOf(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(readFile(t, filepath.Join(dir, hostapi.CertFile)))
	if blk == nil {
		t.Fatalf("no PEM in %s", hostapi.CertFile)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	hosts := []string{"127.0.0.1", "localhost", "agent.example"}
	first, err := hostapi.LoadOrCreateTLS(dir, hosts)
	if err != nil {
		t.Fatal(err)
	}
	if !first.CreatedCA || !first.Issued || first.CAFile != filepath.Join(dir, hostapi.CAFile) {
		t.Errorf("first start: got created CA %v, issued %v, CA file %s; want both, in %s", first.CreatedCA, first.Issued, first.CAFile, dir)
	}
	for name, mode := range map[string]os.FileMode{
		hostapi.CAFile: 0o644, hostapi.CAKeyFile: 0o600, hostapi.CertFile: 0o644, hostapi.KeyFile: 0o600,
	} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: %v, %v; want mode %o", name, st, err, mode)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 4 {
		t.Errorf("files in the data directory: got %d, want the 4 (no temporary file left)", len(ents))
	}
	leaf := leafOf(t, dir)
	for _, h := range hosts {
		if err := leaf.VerifyHostname(h); err != nil {
			t.Errorf("certificate does not name %s: %v", h, err)
		}
	}
	if got := time.Until(first.NotAfter()); got < 300*24*time.Hour {
		t.Errorf("certificate valid for %v more, want about a year", got)
	}
	// The certificate verifies against the CA file alone, as the server's
	// client does.
	cfg, err := hostclient.ClientTLS(first.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cfg.RootCAs, DNSName: "agent.example"}); err != nil {
		t.Errorf("verify against the CA: %v", err)
	}

	ca, cert := readFile(t, first.CAFile), readFile(t, filepath.Join(dir, hostapi.CertFile))
	again, err := hostapi.LoadOrCreateTLS(dir, hosts)
	if err != nil || again.CreatedCA || again.Issued {
		t.Fatalf("second start: got created CA %v, issued %v, %v; want neither", again.CreatedCA, again.Issued, err)
	}
	if !bytes.Equal(readFile(t, first.CAFile), ca) || !bytes.Equal(readFile(t, filepath.Join(dir, hostapi.CertFile)), cert) {
		t.Error("second start rewrote the CA or the certificate")
	}

	// A new host name: a new certificate from the same CA.
	more, err := hostapi.LoadOrCreateTLS(dir, append(hosts, "10.9.8.7"))
	if err != nil || more.CreatedCA || !more.Issued {
		t.Fatalf("new host: got created CA %v, issued %v, %v; want a new certificate only", more.CreatedCA, more.Issued, err)
	}
	if err := leafOf(t, dir).VerifyHostname("10.9.8.7"); err != nil || !bytes.Equal(readFile(t, first.CAFile), ca) {
		t.Errorf("after a new host: %v, CA changed %v", err, !bytes.Equal(readFile(t, first.CAFile), ca))
	}

	// A damaged certificate is replaced.
	os.WriteFile(filepath.Join(dir, hostapi.CertFile), []byte("garbage"), 0o644)
	if c, err := hostapi.LoadOrCreateTLS(dir, hosts); err != nil || !c.Issued {
		t.Errorf("damaged certificate: got issued %v, %v; want a new one", c != nil && c.Issued, err)
	}

	// Without the CA key a good certificate still serves; one that must
	// be reissued cannot be, and the error says what to do.
	os.Rename(filepath.Join(dir, hostapi.CAKeyFile), filepath.Join(dir, "ca-key.away"))
	if c, err := hostapi.LoadOrCreateTLS(dir, hosts); err != nil || c.Issued {
		t.Errorf("without the CA key, same hosts: got %v; want the certificate as it is", err)
	}
	if _, err := hostapi.LoadOrCreateTLS(dir, []string{"other.example"}); err == nil || !strings.Contains(err.Error(), hostapi.CAKeyFile) {
		t.Errorf("without the CA key, new host: got %v, want an error naming %s", err, hostapi.CAKeyFile)
	}
	os.Rename(filepath.Join(dir, "ca-key.away"), filepath.Join(dir, hostapi.CAKeyFile))

	// A key without its CA certificate is an error, not silently a new CA.
	os.Remove(first.CAFile)
	if _, err := hostapi.LoadOrCreateTLS(dir, hosts); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("CA key without its certificate: got %v, want an error", err)
	}

	// Rotation: delete the files, start again: a new CA.
	for _, f := range []string{hostapi.CAKeyFile, hostapi.CertFile, hostapi.KeyFile} {
		os.Remove(filepath.Join(dir, f))
	}
	rot, err := hostapi.LoadOrCreateTLS(dir, hosts)
	if err != nil || !rot.CreatedCA || !rot.Issued || bytes.Equal(readFile(t, rot.CAFile), ca) {
		t.Errorf("after deleting the files: got created CA %v, issued %v, %v; want a new CA", rot.CreatedCA, rot.Issued, err)
	}

	if _, err := hostapi.LoadOrCreateTLS(t.TempDir(), nil); err == nil {
		t.Error("no hosts: got no error")
	}
	if _, err := hostclient.ClientTLS(filepath.Join(dir, hostapi.CertFile+".missing")); err == nil {
		t.Error("ClientTLS of a missing file: got no error")
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("not pem"), 0o644)
	if _, err := hostclient.ClientTLS(bad); err == nil {
		t.Error("ClientTLS of a file without a certificate: got no error")
	}
}

// A certificate near its end is renewed at start and at a handshake, by
// the same CA.
func TestTLSRenewal(t *testing.T) {
	dir := t.TempDir()
	restore := hostapi.SetCertValidity(10 * 24 * time.Hour) // inside the 30 days
	c, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"})
	restore()
	if err != nil {
		t.Fatal(err)
	}
	short := leafOf(t, dir)
	if time.Until(short.NotAfter) > 11*24*time.Hour {
		t.Fatalf("certificate valid until %v, want 10 days", short.NotAfter)
	}
	// At a handshake.
	got, err := c.Config.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Leaf.SerialNumber.Cmp(short.SerialNumber) == 0 || time.Until(got.Leaf.NotAfter) < 300*24*time.Hour {
		t.Errorf("handshake with a certificate 10 days from its end: got serial %v until %v; want a new one for a year", got.Leaf.SerialNumber, got.Leaf.NotAfter)
	}
	if on := leafOf(t, dir); on.SerialNumber.Cmp(got.Leaf.SerialNumber) != 0 {
		t.Errorf("renewed certificate not written to %s", hostapi.CertFile)
	}
	if c.NotAfter() != got.Leaf.NotAfter {
		t.Errorf("NotAfter: got %v, want the renewed %v", c.NotAfter(), got.Leaf.NotAfter)
	}
	// At start.
	restore = hostapi.SetCertValidity(10 * 24 * time.Hour)
	os.Remove(filepath.Join(dir, hostapi.CertFile))
	if _, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	restore()
	c2, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"})
	if err != nil || !c2.Issued || c2.CreatedCA || time.Until(c2.NotAfter()) < 300*24*time.Hour {
		t.Errorf("start with a certificate 10 days from its end: got issued %v, created CA %v, until %v, %v; want a new certificate", c2.Issued, c2.CreatedCA, c2.NotAfter(), err)
	}
}

// The client trusts only the CA it is given: another agent's CA, the
// system's roots or a certificate for another name are refused at once,
// as ErrUntrusted (which is also host.ErrUnavailable).
func TestTLSTrust(t *testing.T) {
	world(t)
	other, err := hostapi.LoadOrCreateTLS(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	otherCfg, err := hostclient.ClientTLS(other.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	wrongName, err := hostapi.LoadOrCreateTLS(t.TempDir(), []string{"agent.example"})
	if err != nil {
		t.Fatal(err)
	}
	wrongNameCfg, _ := hostclient.ClientTLS(wrongName.CAFile)
	hsName := httptest.NewUnstartedServer(hsrv)
	hsName.TLS = serverTLS(wrongName)
	hsName.StartTLS()
	defer hsName.Close()

	for _, tc := range []struct {
		name string
		url  string
		opts []hostclient.Option
	}{
		{"another agent's CA", hs.URL, []hostclient.Option{hostclient.WithTLS(otherCfg)}},
		{"system roots", hs.URL, nil},
		{"certificate for another name", hsName.URL, []hostclient.Option{hostclient.WithTLS(wrongNameCfg)}},
	} {
		_, err := hostclient.Dial(tc.url, testToken, tc.opts...)
		if !errors.Is(err, hostclient.ErrUntrusted) || !errors.Is(err, host.ErrUnavailable) {
			t.Errorf("%s: got %v, want hostclient.ErrUntrusted and host.ErrUnavailable", tc.name, err)
		}
	}
	// The right CA for the name works.
	c, err := hostclient.Dial(hs.URL, testToken, hostclient.WithTLS(tlsCfg))
	if err != nil {
		t.Fatalf("dial with the agent's CA: %v", err)
	}
	c.Close()
}
