package transport

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	long := "unix:///" + strings.Repeat("s", maxUnixPath)
	for _, c := range []struct {
		in, network, address, err string
	}{
		{in: "tcp://127.0.0.1:9510", network: "tcp", address: "127.0.0.1:9510"},
		{in: "TCP://localhost:1", network: "tcp", address: "localhost:1"},
		{in: "tcp://:9510", network: "tcp", address: ":9510"},
		{in: "tcp://[::1]:9510", network: "tcp", address: "[::1]:9510"},
		{in: "127.0.0.1:9510", network: "tcp", address: "127.0.0.1:9510"},
		{in: "[::1]:0", network: "tcp", address: "[::1]:0"},
		{in: "unix:///run/hydra.sock", network: "unix", address: "/run/hydra.sock"},
		{in: "", err: "empty address"},
		{in: "tcp://localhost", err: "missing port"},
		{in: "tcp://localhost:", err: "missing port"},
		{in: "tcp://[::1]", err: "missing port"},
		{in: "localhost", err: "missing port"},
		{in: "tcp://host:http", err: `invalid port "http"`},
		{in: "tcp://host:65536", err: `invalid port "65536"`},
		{in: "tcp://host:9510/x", err: "no path"},
		{in: "unix://run/hydra.sock", err: "must be absolute"},
		{in: "unix://", err: "must be absolute"},
		{in: long, err: "the limit is 107"},
		{in: "tls://host:9510", network: "tls", address: "host:9510"},
		{in: "tls://host", err: "missing port"},
		{in: "http://host:80", err: `unknown scheme "http"`},
		{in: "/run/hydra.sock", err: "unrecognised address"},
	} {
		network, address, err := ParseURL(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseURL(%q) error = %v, want one containing %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || network != c.network || address != c.address {
			t.Errorf("ParseURL(%q) = %q, %q, %v; want %q, %q", c.in, network, address, err, c.network, c.address)
		}
	}
}

// echoServe echoes every connection on l until l is closed.
func echoServe(t *testing.T, l net.Listener) {
	t.Helper()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
}

// checkEcho dials rawURL and checks a round trip.
func checkEcho(t *testing.T, rawURL string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, rawURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ping" {
		t.Fatalf("echo = %q, %v", b, err)
	}
}

func TestListenTCP(t *testing.T) {
	l, err := Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	echoServe(t, l)
	checkEcho(t, "tcp://"+l.Addr().String())

	l2, err := Listen("127.0.0.1:0") // bare host:port
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	echoServe(t, l2)
	checkEcho(t, l2.Addr().String())
}

func TestListenUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.sock")
	l, err := Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode = %v, want a socket with 0600", fi.Mode())
	}
	echoServe(t, l)
	checkEcho(t, "unix://"+path)

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket file left after Close: %v", err)
	}
}

func TestListenUnixStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.sock")
	// A socket file nobody listens on, as a crashed server leaves it.
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket not left behind: %v", err)
	}

	l, err := Listen("unix://" + path)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	defer l.Close()
	echoServe(t, l)
	checkEcho(t, "unix://"+path)
}

func TestListenUnixRefusesLiveSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h.sock")
	live, err := Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	if l, err := Listen("unix://" + path); err == nil || !strings.Contains(err.Error(), "in use") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("second Listen on a live socket: err = %v, want an in-use error", err)
	}
	// The live server keeps its socket (it saw the probe as a connection that
	// closed at once).
	echoServe(t, live)
	checkEcho(t, "unix://"+path)
}

func TestListenUnixRefusesNonSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix://" + file); err == nil || !strings.Contains(err.Error(), "a regular file, not a socket") {
		t.Fatalf("Listen over a regular file: err = %v", err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Fatalf("regular file damaged: %q, %v", b, err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix://" + sub); err == nil || !strings.Contains(err.Error(), "a directory") {
		t.Fatalf("Listen over a directory: err = %v", err)
	}
}

func TestDialErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := Dial(ctx, "gopher://x:1"); err == nil {
		t.Error("unknown scheme dialled")
	}
	if _, err := Dial(ctx, "unix://"+filepath.Join(t.TempDir(), "none.sock")); err == nil {
		t.Error("dial to a missing socket succeeded")
	}
}
