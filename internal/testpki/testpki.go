// Package testpki makes throwaway certificates for tests of TLS listeners.
package testpki

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

// PKI is a CA, a server certificate for 127.0.0.1 and a client certificate,
// all signed by the CA, as PEM files.
type PKI struct{ CA, ServerCert, ServerKey, ClientCert, ClientKey string }

// New writes a fresh PKI into a test's temporary directory.
func New(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hydra test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, []byte) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "hydra"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(k)
		return der, kder
	}
	sc, sk := leaf(2, x509.ExtKeyUsageServerAuth)
	cc, ck := leaf(3, x509.ExtKeyUsageClientAuth)
	return PKI{
		CA:         write("ca.pem", "CERTIFICATE", caDER),
		ServerCert: write("srv.pem", "CERTIFICATE", sc), ServerKey: write("srv.key", "EC PRIVATE KEY", sk),
		ClientCert: write("cli.pem", "CERTIFICATE", cc), ClientKey: write("cli.key", "EC PRIVATE KEY", ck),
	}
}

// ClientCA is the CA that signed the client certificate (the same CA).
func (p PKI) ClientCA() string { return p.CA }
