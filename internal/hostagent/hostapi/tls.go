package hostapi

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// The files of a host agent's credentials, in its data directory. The
// keys are 0600, the certificates 0644. Every agent has its own: a token
// (TokenFile), and a CA of its own (CAFile, CAKeyFile) that signed the
// certificate it serves the host API with (CertFile, KeyFile). The control
// plane trusts exactly that CA for that agent.
const (
	TokenFile = "agent.token"
	CAFile    = "agent-ca.pem"
	CAKeyFile = "agent-ca-key.pem"
	CertFile  = "agent-cert.pem"
	KeyFile   = "agent-key.pem"
)

// Validity of what LoadOrCreateTLS makes. A serving certificate that is
// within certRenewBefore of its end (or does not name every host) is
// replaced at start, or at the first handshake that finds it so, by one
// the same CA signs: the control plane need not be told.
var (
	caValidity      = 10 * 365 * 24 * time.Hour
	certValidity    = 365 * 24 * time.Hour
	certRenewBefore = 30 * 24 * time.Hour
)

// AgentTLS is a host agent's TLS identity, from LoadOrCreateTLS.
type AgentTLS struct {
	// Config serves the host API: TLS 1.3, HTTP/1.1 only (exec is full
	// duplex over one HTTP/1.1 request; see hostwire's package documentation).
	Config *tls.Config
	// CAFile is the CA certificate that the control plane must trust
	// (panda server --agent-ca-file).
	CAFile string
	// CreatedCA reports that the CA was made now: it must be given to
	// the control plane (again, if an old one was deleted to rotate it).
	CreatedCA bool
	// Issued reports that a new serving certificate was written (first
	// start, changed host names, or renewal).
	Issued bool
	// Hosts are the names and addresses the serving certificate is for.
	Hosts []string

	src *certSource
}

// NotAfter is when the serving certificate now in use expires.
func (a *AgentTLS) NotAfter() time.Time {
	a.src.mu.Lock()
	defer a.src.mu.Unlock()
	return a.src.cert.Leaf.NotAfter
}

// LoadOrCreateTLS loads the host agent's TLS credentials from dir and
// makes what is missing: on first start a CA (ECDSA P-256, valid 10
// years) and a serving certificate it signs (valid a year) for hosts (DNS
// names or IP addresses). A serving certificate that does not name every
// one of hosts, does not match the CA, or expires within 30 days is
// replaced. The CA's key is needed only then: an operator may move it
// away. To rotate everything, delete the four files (and the token) and
// restart; see docs/deployment.md.
func LoadOrCreateTLS(dir string, hosts []string) (*AgentTLS, error) {
	if len(hosts) == 0 {
		return nil, errors.New("agent tls: no host names for the certificate")
	}
	s := &certSource{dir: dir, hosts: slices.Clone(hosts)}
	out := &AgentTLS{CAFile: filepath.Join(dir, CAFile), Hosts: s.hosts, src: s}
	var err error
	s.ca, s.caKey, out.CreatedCA, err = loadOrCreateCA(dir)
	if err != nil {
		return nil, err
	}
	// A missing or damaged pair is replaced.
	cert, err := loadCert(dir)
	if err != nil || !s.good(cert, time.Now()) {
		if cert, err = s.issue(); err != nil {
			return nil, err
		}
		out.Issued = true
	}
	s.cert = cert
	out.Config = &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     []string{"http/1.1"},
		GetCertificate: s.get,
	}
	return out, nil
}

// certSource serves the agent's certificate and renews it.
type certSource struct {
	dir   string
	hosts []string
	ca    *x509.Certificate
	caKey crypto.Signer // nil if CAKeyFile is absent: no renewal

	mu   sync.Mutex
	cert *tls.Certificate // Leaf set
}

func (s *certSource) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.caKey != nil && time.Until(s.cert.Leaf.NotAfter) < certRenewBefore {
		// On failure the old certificate serves until it expires; the
		// next handshake tries again.
		if c, err := s.issue(); err == nil {
			s.cert = c
		}
	}
	return s.cert, nil
}

// good reports whether cert can serve: signed by the CA, naming every
// host, and not near its end.
func (s *certSource) good(cert *tls.Certificate, now time.Time) bool {
	leaf := cert.Leaf
	if leaf.CheckSignatureFrom(s.ca) != nil || now.Before(leaf.NotBefore) || leaf.NotAfter.Sub(now) < certRenewBefore {
		return false
	}
	for _, h := range s.hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// issue makes and writes a serving certificate for s.hosts.
func (s *certSource) issue() (*tls.Certificate, error) {
	if s.caKey == nil {
		return nil, fmt.Errorf("agent tls: the serving certificate %s must be renewed but the CA key %s is missing (restore it, or delete %s to make a new CA and give it to panda server)",
			filepath.Join(s.dir, CertFile), filepath.Join(s.dir, CAKeyFile), filepath.Join(s.dir, CAFile))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("agent tls: generate key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "PandaStack host agent"},
		NotBefore:    now.Add(-time.Hour), // some clock skew
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range s.hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, key.Public(), s.caKey)
	if err != nil {
		return nil, fmt.Errorf("agent tls: sign certificate: %w", err)
	}
	// The key first: a certificate on disk always has its key.
	if err := writePEM(filepath.Join(s.dir, KeyFile), 0o600, keyBlock(key)); err != nil {
		return nil, err
	}
	if err := writePEM(filepath.Join(s.dir, CertFile), 0o644, &pem.Block{Type: "CERTIFICATE", Bytes: der}); err != nil {
		return nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// loadOrCreateCA loads the agent's CA, or makes one if neither of its
// files exists. caKey is nil if only the certificate is there.
func loadOrCreateCA(dir string) (ca *x509.Certificate, caKey crypto.Signer, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	certPEM, certErr := os.ReadFile(certPath)
	keyPEM, keyErr := os.ReadFile(keyPath)
	switch {
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		ca, caKey, err = createCA(dir)
		return ca, caKey, err == nil, err
	case errors.Is(certErr, fs.ErrNotExist):
		return nil, nil, false, fmt.Errorf("agent tls: %s exists without %s: delete it to make a new CA", keyPath, certPath)
	case certErr != nil:
		return nil, nil, false, fmt.Errorf("agent tls: %w", certErr)
	case keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist):
		return nil, nil, false, fmt.Errorf("agent tls: %w", keyErr)
	}
	ca, err = parseCert(certPEM)
	if err != nil {
		return nil, nil, false, fmt.Errorf("agent tls: %s: %w", certPath, err)
	}
	if !ca.IsCA {
		return nil, nil, false, fmt.Errorf("agent tls: %s is not a CA certificate", certPath)
	}
	if keyErr == nil {
		caKey, err = parseKey(keyPEM)
		if err != nil {
			return nil, nil, false, fmt.Errorf("agent tls: %s: %w", keyPath, err)
		}
		if !publicKeysEqual(caKey.Public(), ca.PublicKey) {
			return nil, nil, false, fmt.Errorf("agent tls: %s is not the key of %s", keyPath, certPath)
		}
	}
	return ca, caKey, false, nil
}

func createCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("agent tls: generate CA key: %w", err)
	}
	host, _ := os.Hostname()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		// Each CA has a name of its own, to tell them apart.
		Subject:               pkix.Name{CommonName: fmt.Sprintf("PandaStack host agent CA %s %s", host, rand.Text()[:8])},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("agent tls: make CA: %w", err)
	}
	// The key first: with only the key on disk, the next start says what
	// to delete; a certificate without its key could never sign.
	if err := writePEM(filepath.Join(dir, CAKeyFile), 0o600, keyBlock(key)); err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(dir, CAFile), 0o644, &pem.Block{Type: "CERTIFICATE", Bytes: der}); err != nil {
		return nil, nil, err
	}
	ca, _ := x509.ParseCertificate(der)
	return ca, key, nil
}

// loadCert reads the serving certificate and its key.
func loadCert(dir string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
	}
	return &cert, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1)) // positive
}

func keyBlock(key *ecdsa.PrivateKey) *pem.Block {
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	return &pem.Block{Type: "PRIVATE KEY", Bytes: der}
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || !strings.HasSuffix(blk.Type, "PRIVATE KEY") {
		return nil, errors.New("no PEM private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		if ek, err2 := x509.ParseECPrivateKey(blk.Bytes); err2 == nil {
			return ek, nil
		}
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key %T", k)
	}
	return s, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

// writePEM writes blk to path with mode, atomically: a temporary file,
// fsync'd, renamed over path, the directory fsync'd. A crash leaves the
// old file or the new one, never a torn one.
func writePEM(path string, mode os.FileMode, blk *pem.Block) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("agent tls: write %s: %w", path, err)
	}
	tmp := f.Name()
	err = f.Chmod(mode)
	if err == nil {
		err = pem.Encode(f, blk)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("agent tls: write %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
