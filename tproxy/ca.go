package tproxy

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// Validity of the certificates a CA makes.
const (
	caValidity   = 2 * 365 * 24 * time.Hour
	leafValidity = 24 * time.Hour
	// leafRenew is how long before NotAfter a cached leaf is replaced.
	leafRenew = 2 * time.Hour
	// leafCacheSize bounds the cached leaves per sandbox.
	leafCacheSize = 4096
)

// systemRootFiles are where distributions keep their CA bundle.
var systemRootFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/ca-bundle.pem",             // openSUSE
	"/etc/ssl/cert.pem",                  // others
}

// CA is a sandbox's certificate authority: it mints leaf certificates for
// the hosts the proxy intercepts. Its key never leaves the state directory
// (0600); members trust its certificate through BundleFile.
type CA struct {
	cert    *x509.Certificate
	certDER []byte
	key     *ecdsa.PrivateKey
	leafKey *ecdsa.PrivateKey // one key for every leaf: minting is a signature
	dir     string
	now     func() time.Time

	group singleflight.Group
	// mu guards the LRU.
	mu    sync.Mutex
	lru   *list.List // of *leafEntry, front = most recent
	byKey map[string]*list.Element
}

type leafEntry struct {
	host string
	cert *tls.Certificate
}

// LoadOrCreateCA loads the CA in dir (STATE_DIR/ca/SANDBOX), creating it on
// first use: ca.key (0600), ca.pem, and bundle.pem (the system roots and
// the CA, for members).
func LoadOrCreateCA(dir, sandbox string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox CA: %w", err)
	}
	keyPath, certPath := filepath.Join(dir, "ca.key"), filepath.Join(dir, "ca.pem")
	ca := &CA{dir: dir, now: time.Now, lru: list.New(), byKey: make(map[string]*list.Element)}
	keyPEM, kerr := os.ReadFile(keyPath)
	certPEM, cerr := os.ReadFile(certPath)
	switch {
	case kerr == nil && cerr == nil:
		if err := ca.parse(keyPEM, certPEM); err != nil {
			return nil, fmt.Errorf("sandbox CA in %s: %w; move the files away to create a new one", dir, err)
		}
		if fi, err := os.Stat(keyPath); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("sandbox CA key %s is readable by others (mode %v); chmod 600 it", keyPath, fi.Mode().Perm())
		}
	case errors.Is(kerr, os.ErrNotExist) && errors.Is(cerr, os.ErrNotExist):
		if err := ca.create(sandbox, keyPath, certPath); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("sandbox CA in %s is incomplete (ca.key: %v, ca.pem: %v); remove both to create a new one", dir, kerr, cerr)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca.leafKey = leafKey
	if err := ca.writeBundle(); err != nil {
		return nil, err
	}
	return ca, nil
}

func (ca *CA) create(sandbox, keyPath, certPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{CommonName: "airlock sandbox " + sandbox, Organization: []string{"airlock"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("write CA key: %w", err)
	}
	if err := writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("write CA certificate: %w", err)
	}
	ca.cert, _ = x509.ParseCertificate(der)
	ca.certDER, ca.key = der, key
	return nil
}

func (ca *CA) parse(keyPEM, certPEM []byte) error {
	kb, _ := pem.Decode(keyPEM)
	cb, _ := pem.Decode(certPEM)
	if kb == nil || cb == nil {
		return errors.New("not PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return errors.New("key and certificate do not belong together")
	}
	ca.cert, ca.certDER, ca.key = cert, cb.Bytes, key
	return nil
}

// writeBundle writes bundle.pem: the system roots, then the sandbox CA.
func (ca *CA) writeBundle() error {
	var bundle []byte
	for _, f := range systemRootFiles {
		if b, err := os.ReadFile(f); err == nil {
			bundle = append(b, '\n')
			break
		}
	}
	bundle = append(bundle, ca.CertPEM()...)
	return writeFileAtomic(ca.BundleFile(), bundle, 0o644)
}

// CacheLen returns how many leaf certificates are cached.
func (ca *CA) CacheLen() int {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.lru.Len()
}

// CertPEM returns the CA certificate in PEM.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.certDER})
}

// CertFile is the CA certificate's path; BundleFile the system roots plus
// the CA, which `airlock run` points members at.
func (ca *CA) CertFile() string   { return filepath.Join(ca.dir, "ca.pem") }
func (ca *CA) BundleFile() string { return filepath.Join(ca.dir, "bundle.pem") }

// Leaf returns a certificate for host, minting it on a cache miss.
// Concurrent misses for one host mint once. A hit only looks the host up.
func (ca *CA) Leaf(host string) (*tls.Certificate, error) {
	now := ca.now()
	ca.mu.Lock()
	if e, ok := ca.byKey[host]; ok {
		le := e.Value.(*leafEntry)
		if now.Before(le.cert.Leaf.NotAfter.Add(-leafRenew)) {
			ca.lru.MoveToFront(e)
			ca.mu.Unlock()
			return le.cert, nil
		}
	}
	ca.mu.Unlock()
	v, err, _ := ca.group.Do(host, func() (any, error) {
		// Minted meanwhile by a call that ended before this one began?
		ca.mu.Lock()
		if e, ok := ca.byKey[host]; ok {
			if le := e.Value.(*leafEntry); now.Before(le.cert.Leaf.NotAfter.Add(-leafRenew)) {
				ca.mu.Unlock()
				return le.cert, nil
			}
		}
		ca.mu.Unlock()
		c, err := ca.mint(host, now)
		if err != nil {
			return nil, err
		}
		ca.mu.Lock()
		defer ca.mu.Unlock()
		if e, ok := ca.byKey[host]; ok {
			e.Value.(*leafEntry).cert = c
			ca.lru.MoveToFront(e)
		} else {
			ca.byKey[host] = ca.lru.PushFront(&leafEntry{host: host, cert: c})
			if ca.lru.Len() > leafCacheSize {
				old := ca.lru.Back()
				ca.lru.Remove(old)
				delete(ca.byKey, old.Value.(*leafEntry).host)
			}
		}
		return c, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*tls.Certificate), nil
}

func (ca *CA) mint(host string, now time.Time) (*tls.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("mint certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.certDER}, PrivateKey: ca.leafKey, Leaf: leaf}, nil
}

func randomSerial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n.Add(n, big.NewInt(1))
}

// writeFileAtomic writes data to path through a synced temporary file and
// a rename, so path holds the old or the new content, never a mix.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	err = tmp.Chmod(mode)
	if err == nil {
		_, err = tmp.Write(data)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
