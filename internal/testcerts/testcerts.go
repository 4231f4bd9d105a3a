// Package testcerts issues throwaway X.509 certificates for tests: a
// self-signed CA and leaf certificates it signs, written as PEM files in a
// test's temp dir. Keys are ECDSA P-256; every leaf is valid for both
// server and client authentication, for a day. It uses crypto/x509 only,
// so no test needs openssl, cfssl or the network.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that signs leaves.
type CA struct {
	// Cert is the CA's own certificate.
	Cert *x509.Certificate
	// File is the PEM file holding Cert (the CA bundle to trust).
	File string
	key  *ecdsa.PrivateKey
	dir  string
}

// Pair names the PEM files of one leaf certificate and its key.
type Pair struct {
	CertFile, KeyFile string
}

// NewCA creates a CA named name, writing its certificate to
// dir/name-ca.pem; dir is usually t.TempDir().
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name + " test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcerts: creating CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcerts: parsing CA: %v", err)
	}
	ca := &CA{Cert: cert, key: key, dir: dir, File: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue signs a leaf with common name cn, valid for hosts (IP addresses
// or DNS names; none gives a client-only identity), and writes it to
// dir/cn.pem and dir/cn-key.pem in the CA's directory.
func (ca *CA) Issue(t testing.TB, cn string, hosts ...string) Pair {
	t.Helper()
	return ca.IssueTo(t, filepath.Join(ca.dir, cn), cn, hosts...)
}

// IssueTo is Issue writing to base+".pem" and base+"-key.pem", so a test
// can overwrite the files of a pair already in use (to test reloading).
func (ca *CA) IssueTo(t testing.TB, base, cn string, hosts ...string) Pair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcerts: issuing %s: %v", cn, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testcerts: encoding key of %s: %v", cn, err)
	}
	p := Pair{CertFile: base + ".pem", KeyFile: base + "-key.pem"}
	// The key first: a reader that sees the new certificate then finds
	// the key that matches it (a reader in between sees a mismatch and
	// must keep what it had).
	writePEM(t, p.KeyFile, "PRIVATE KEY", keyDER)
	writePEM(t, p.CertFile, "CERTIFICATE", der)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcerts: generating key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		t.Fatalf("testcerts: serial: %v", err)
	}
	return n
}

// writePEM writes one PEM block to path through a rename, so a reader
// never sees a half-written file.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatalf("testcerts: %v", err)
	}
}
