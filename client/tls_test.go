package client

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

// writePair writes a self-signed certificate named cn and its key to
// base.pem and base-key.pem, moving their modification time on by bump
// (so a rewrite is seen on coarse timestamps).
func writePair(t *testing.T, base, cn string, bump time.Duration) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for path, block := range map[string]*pem.Block{base + ".pem": {Type: "CERTIFICATE", Bytes: der}, base + "-key.pem": {Type: "PRIVATE KEY", Bytes: kder}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		mod := time.Now().Add(bump)
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeyPairReloads: the client certificate is read again when its
// files change, and a change that does not load keeps the pair before.
func TestKeyPairReloads(t *testing.T) {
	base := filepath.Join(t.TempDir(), "client")
	writePair(t, base, "first", 0)
	kp := &keyPair{certFile: base + ".pem", keyFile: base + "-key.pem"}
	cn := func() string {
		t.Helper()
		c, err := kp.get()
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	if got := cn(); got != "first" {
		t.Fatalf("loaded %q, want first", got)
	}
	writePair(t, base, "second", 2*time.Second)
	if got := cn(); got != "second" {
		t.Fatalf("after rotation %q, want second", got)
	}
	if err := os.WriteFile(kp.keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := cn(); got != "second" {
		t.Fatalf("after a broken key %q, want second kept", got)
	}
	if err := os.Remove(kp.certFile); err != nil {
		t.Fatal(err)
	}
	if got := cn(); got != "second" {
		t.Fatalf("after the certificate vanished %q, want second kept", got)
	}
	fresh := &keyPair{certFile: kp.certFile, keyFile: kp.keyFile}
	if _, err := fresh.get(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("first load of missing files: %v, want ErrInvalidArgument", err)
	}
}

// TestTLSOptionsRefuseBadFiles: New refuses a CA bundle it cannot use,
// an empty WithTLSCAFile path among them, before dialling.
func TestTLSOptionsRefuseBadFiles(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "passwd")
	if err := os.WriteFile(notPEM, []byte("root:x:0:0::/root:/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, opt := range map[string]Option{
		"empty_path":   WithTLSCAFile(""),
		"missing_file": WithTLSCAFile(filepath.Join(dir, "missing.pem")),
		"not_pem":      WithTLSCAFile(notPEM),
	} {
		if c, err := New("127.0.0.1:1", opt); !errors.Is(err, ErrInvalidArgument) || c != nil {
			t.Errorf("%s: New = %v, %v; want nil and ErrInvalidArgument", name, c, err)
		}
	}
}
