package transport

import (
	"context"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/testpki"
)

func TestTLSListenerWithClientCertificates(t *testing.T) {
	pki := testpki.New(t)
	srvCfg, err := ServerTLSConfig(pki.ServerCert, pki.ServerKey, pki.CA)
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

	good, err := ClientTLSConfig(pki.CA, pki.ClientCert, pki.ClientKey, "")
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
	anon, _ := ClientTLSConfig(pki.CA, "", "", "")
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
