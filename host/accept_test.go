package host

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// failingListener fails its first fails Accepts with EMFILE, as accept4
// does when the process is out of descriptors, then hands out conns and
// finally blocks until closed.
type failingListener struct {
	mu     sync.Mutex
	fails  int
	conns  []net.Conn
	calls  int
	closed chan struct{}
	once   sync.Once
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls++
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	if len(l.conns) > 0 {
		c := l.conns[0]
		l.conns = l.conns[1:]
		l.mu.Unlock()
		return c, nil
	}
	l.mu.Unlock()
	<-l.closed
	return nil, net.ErrClosed
}

func (l *failingListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *failingListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// info sends INFO on c and returns the reply's status and meta.
func info(t *testing.T, c net.Conn) (transport.Status, string, error) {
	t.Helper()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpInfo})); err != nil {
		return 0, "", err
	}
	h, err := transport.ReadResponseHeader(c)
	if err != nil {
		return 0, "", err
	}
	meta := make([]byte, h.MetaLen)
	if _, err := io.ReadFull(c, meta); err != nil {
		return 0, "", err
	}
	return h.Status, string(meta), nil
}

// TestServeRetriesAcceptErrors: accept failing with EMFILE (the engine out
// of descriptors) does not end Serve: it backs off, serves the connection
// that comes next, counts the failures, and ends only when the listener is
// closed by Shutdown.
func TestServeRetriesAcceptErrors(t *testing.T) {
	var logs bytes.Buffer
	s := NewServer(&stateBackend{}, iface.BackendInfo{NSlots: 1}, nil, Config{
		Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn}),
	})
	client, server := net.Pipe()
	defer client.Close()
	l := &failingListener{fails: 6, conns: []net.Conn{server}, closed: make(chan struct{})}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()

	st, meta, err := info(t, client)
	if err != nil || st != transport.StatusOK {
		t.Fatalf("INFO after 6 failed accepts: status %v, %q, %v", st, meta, err)
	}
	if got := s.Stats().Connections().AcceptErrors; got != 6 {
		t.Errorf("AcceptErrors = %d, want 6", got)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned while its listener was open: %v", err)
	default:
	}
	s.Shutdown(time.Second)
	if err := <-served; err != nil {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
	if n := strings.Count(logs.String(), "accepting a connection failed"); n != 1 {
		t.Errorf("%d log lines for 6 failures in a row, want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "too many open files") {
		t.Errorf("the log does not name the error:\n%s", logs.String())
	}
}

// TestAcceptRetryBackoff: the pause doubles from 5 ms to 1 s, a success
// starts it over, and failures are logged at most once per acceptLogEvery
// with the count since the last line.
func TestAcceptRetryBackoff(t *testing.T) {
	var logs bytes.Buffer
	now := time.Unix(1000, 0)
	r := &acceptRetry{
		log:     hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn}),
		nowFunc: func() time.Time { return now },
	}
	emfile := os.NewSyscallError("accept4", syscall.EMFILE)
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000}
	for i, w := range want {
		if got := r.failed(emfile); got != w*time.Millisecond {
			t.Fatalf("failure %d: pause %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	r.succeeded()
	if got := r.failed(emfile); got != acceptDelayMin {
		t.Fatalf("pause after a success: %v, want %v", got, acceptDelayMin)
	}
	if n := strings.Count(logs.String(), "\n"); n != 1 {
		t.Fatalf("%d log lines within %v, want 1:\n%s", n, acceptLogEvery, logs.String())
	}
	now = now.Add(acceptLogEvery)
	r.failed(emfile)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "failures=12") || !strings.Contains(lines[1], "failures_total=13") {
		t.Fatalf("after %v: want a second line counting 12 failures since the first:\n%s", acceptLogEvery, logs.String())
	}
}

// TestConnLimitRefusesWithBusy: a listener with MaxConns 2 serves two
// connections; a third is answered BUSY with the limit in the error and
// closed; once one of the two closes, a new connection is served again.
func TestConnLimitRefusesWithBusy(t *testing.T) {
	s := NewServer(&stateBackend{}, iface.BackendInfo{NSlots: 1}, nil, Config{MaxConns: 2})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	defer s.Close()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first := dial()
	for _, c := range []net.Conn{first, dial()} {
		if st, meta, err := info(t, c); err != nil || st != transport.StatusOK {
			t.Fatalf("INFO within the limit: %v %q %v", st, meta, err)
		}
	}
	over := dial()
	st, meta, err := info(t, over)
	if err != nil || st != transport.StatusBusy || meta != `{"error":"too many connections: the limit is 2 per listener"}` {
		t.Fatalf("beyond the limit: status %v, meta %q, %v; want BUSY with the limit", st, meta, err)
	}
	if n, err := over.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("refused connection after the reply: %d bytes, %v; want EOF", n, err)
	}
	if got := s.Stats().Connections(); got.Refused != 1 || got.Open != 2 {
		t.Errorf("Connections() = %+v, want 1 refused and 2 open", got)
	}
	first.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _, err := info(t, dial())
		if err == nil && st == transport.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after one of the two closed: %v %v", st, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
