package gie

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeSelfSigned writes a self-signed certificate and its key to
// dir/name.pem and dir/name-key.pem.
func writeSelfSigned(t *testing.T, dir, name string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	for path, b := range map[string]*pem.Block{cert: {Type: "CERTIFICATE", Bytes: der}, key: {Type: "PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key
}

// TestDialKVIndexTLS: the TLS parameters go to the client module's own
// options, which read the files at dial (and the client certificate again
// when it changes: client/tls.go); unreadable files are ErrInvalidConfig.
func TestDialKVIndexTLS(t *testing.T) {
	dir := t.TempDir()
	ca, _ := writeSelfSigned(t, dir, "ca")
	cert, key := writeSelfSigned(t, dir, "client")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("no certificate here"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		params ProducerParams
		ok     bool
	}{
		{"plaintext", ProducerParams{Target: "127.0.0.1:1"}, true},
		{"ca", ProducerParams{Target: "127.0.0.1:1", CAFile: ca}, true},
		{"mtls", ProducerParams{Target: "127.0.0.1:1", CAFile: ca, CertFile: cert, KeyFile: key, ServerName: "indexd"}, true},
		{"missing_ca", ProducerParams{Target: "127.0.0.1:1", CAFile: filepath.Join(dir, "absent.pem")}, false},
		{"ca_not_pem", ProducerParams{Target: "127.0.0.1:1", CAFile: notPEM}, false},
		{"missing_key", ProducerParams{Target: "127.0.0.1:1", CAFile: ca, CertFile: cert, KeyFile: filepath.Join(dir, "absent-key.pem")}, false},
		{"no_target", ProducerParams{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := tc.params
			params.FillDefaults()
			k, err := DialKVIndex(params)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				_ = k.Close()
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}
