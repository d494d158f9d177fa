package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/testpki"
)

// TestTLSListener: a tls:// listener with client-certificate verification
// serves hydractl with a certificate and refuses one without.
func TestTLSListener(t *testing.T) {
	pki := testpki.New(t)
	url := fmt.Sprintf("tls://127.0.0.1:%d", freePort(t))
	startEngine(t, "--rpc", url, "--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--tls-client-ca", pki.ClientCA())
	out, errOut, err := hydractl(t, "--addr", url, "--tls-ca", pki.CA, "--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey, "info")
	if err != nil || !strings.Contains(out, `"engine":"hydra-engine"`) {
		t.Fatalf("INFO over mTLS: %v %s %s", err, out, errOut)
	}
	if _, errOut, err := hydractl(t, "--addr", url, "--tls-ca", pki.CA, "info"); err == nil {
		t.Fatal("a client without a certificate was served")
	} else if errOut == "" {
		t.Fatal("no error message for a refused client")
	}
	if _, _, err := hydractl(t, "--addr", url, "info"); err == nil {
		t.Fatal("a client that does not trust the engine's CA connected")
	}
}

// TestTLSStateRoundTrip: a state of several MiB goes out and back in over
// TLS, where the engine cannot splice the client's bytes and restores
// through the shm ring.
func TestTLSStateRoundTrip(t *testing.T) {
	pki := testpki.New(t)
	url := fmt.Sprintf("tls://127.0.0.1:%d", freePort(t))
	startEngine(t, "--rpc", url, "--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--backend-opt", "kv_bytes_per_token=65536")
	tlsArgs := []string{"--addr", url, "--tls-ca", pki.CA}
	toks := make([]string, 100)
	for i := range toks {
		toks[i] = fmt.Sprint(3 + i*7%250)
	}
	blob := filepath.Join(t.TempDir(), "state.blob")
	for _, args := range [][]string{
		{"prefill", "--slot", "0", "--tokens", strings.Join(toks, ",")},
		{"--no-progress", "state", "get", "--slot", "0", "-o", blob},
		{"--no-progress", "state", "put", "--slot", "1", "-i", blob},
	} {
		if out, errOut, err := hydractl(t, append(slices.Clone(tlsArgs), args...)...); err != nil {
			t.Fatalf("hydractl %v: %v %s %s", args, err, out, errOut)
		}
	}
	if st, err := os.Stat(blob); err != nil || st.Size() < 6<<20 {
		t.Fatalf("state blob: %v, %v", st, err)
	}
	out, _, err := hydractl(t, append(slices.Clone(tlsArgs), "meta", "--slot", "1")...)
	if err != nil || !strings.Contains(out, `"n_past":100`) {
		t.Fatalf("slot 1 after the restore: %v %s", err, out)
	}
}

// TestTLSNeedsKeyPair: an engine asked for a tls:// listener without a
// certificate refuses to start, with a clear message.
func TestTLSNeedsKeyPair(t *testing.T) {
	cmd := exec.Command(filepath.Join(binDir, "hydra-engine"), "--rpc", fmt.Sprintf("tls://127.0.0.1:%d", freePort(t)))
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "tls_cert") {
		t.Fatalf("engine with a tls:// listener and no certificate: %v\n%s", err, out)
	}
}

func fileSHA256(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestPluginChecksumPin: the engine runs a plugin whose SHA-256 matches the
// pin and refuses one that does not.
func TestPluginChecksumPin(t *testing.T) {
	sum := fileSHA256(t, filepath.Join(binDir, "hydra-plugin-mock"))
	e := startEngine(t, "--backend-sha256", sum)
	mustOK(t, client(t, e.tcp), 0x41, "", nil)

	wrong := strings.Repeat("0", 64)
	cmd := exec.Command(filepath.Join(binDir, "hydra-engine"), "--rpc", fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)),
		"--backend", filepath.Join(binDir, "hydra-plugin-mock"), "--backend-sha256", wrong)
	done := make(chan []byte, 1)
	go func() { out, _ := cmd.CombinedOutput(); done <- out }()
	select {
	case out := <-done:
		if cmd.ProcessState.Success() || !strings.Contains(strings.ToLower(string(out)), "checksum") {
			t.Fatalf("engine with a wrong plugin pin: %v\n%s", cmd.ProcessState, out)
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatal("engine with a wrong plugin pin kept running")
	}
}

// TestUnixSocketMode: the Unix listener is private to the engine's user.
func TestUnixSocketMode(t *testing.T) {
	e := startEngine(t)
	st, err := os.Stat(strings.TrimPrefix(e.unix, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", st.Mode().Perm())
	}
}

// TestClientSendBufferHint: serving a Unix socket, the engine says at start
// when clients that set no SO_SNDBUF will send through a window smaller than
// 4 MiB (net.core.wmem_default), and only then.
func TestClientSendBufferHint(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/core/wmem_default")
	if err != nil {
		t.Skip("no net.core.wmem_default here:", err)
	}
	wmem, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	e := startEngine(t)
	// The sockets take connections from listen(2) on; the hint comes before
	// the engine logs that it serves them.
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(e.logs.String(), "serving Hydra RPC"); {
		if time.Now().After(deadline) {
			t.Fatalf("no \"serving Hydra RPC\" logged\n%s", e.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	hinted := strings.Contains(e.logs.String(), "net.core.wmem_default in flight")
	if want := wmem < 4<<20; hinted != want {
		t.Fatalf("wmem_default %d: hint logged %v, want %v\n%s", wmem, hinted, want, e.logs)
	}
}
