package transport

import (
	"context"
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

// testPKI writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, and returns their file names.
type testPKI struct{ ca, srvCert, srvKey, cliCert, cliKey string }

func newTestPKI(t *testing.T) testPKI {
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
	return testPKI{
		ca:      write("ca.pem", "CERTIFICATE", caDER),
		srvCert: write("srv.pem", "CERTIFICATE", sc), srvKey: write("srv.key", "EC PRIVATE KEY", sk),
		cliCert: write("cli.pem", "CERTIFICATE", cc), cliKey: write("cli.key", "EC PRIVATE KEY", ck),
	}
}

func TestTLSListenerWithClientCertificates(t *testing.T) {
	pki := newTestPKI(t)
	srvCfg, err := ServerTLSConfig(pki.srvCert, pki.srvKey, pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen("tls://127.0.0.1:0", WithTLS(srvCfg))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := make([]byte, 5)
				if _, err := c.Read(b); err == nil {
					c.Write(b)
				}
			}()
		}
	}()
	url := "tls://" + l.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	good, err := ClientTLSConfig(pki.ca, pki.cliCert, pki.cliKey, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(ctx, url, WithTLS(good))
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("hello"))
	b := make([]byte, 5)
	if _, err := c.Read(b); err != nil || string(b) != "hello" {
		t.Fatalf("echo over mTLS: %q %v", b, err)
	}
	c.Close()

	// No client certificate: the handshake fails (TLS 1.3 reports it on the
	// first read).
	anon, _ := ClientTLSConfig(pki.ca, "", "", "")
	if c, err := Dial(ctx, url, WithTLS(anon)); err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("hello"))
		if _, err := c.Read(b); err == nil {
			t.Fatal("a client without a certificate was served")
		}
		c.Close()
	}
	// A server the client does not trust.
	if _, err := Dial(ctx, url, WithTLS(nil)); err == nil {
		t.Fatal("dialled a server signed by an unknown CA")
	}
	if _, err := Listen("tls://127.0.0.1:0"); err == nil {
		t.Fatal("a tls:// listener without a certificate was accepted")
	}
}
