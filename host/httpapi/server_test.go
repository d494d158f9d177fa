package httpapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// budgetServer is a host server over the mock with a payload budget of
// budget bytes, and an HTTP server in front of it whose handler reads
// every body through readAdmittedBody and answers its length.
func budgetServer(t *testing.T, budget uint64) (*host.Server, string) {
	t.Helper()
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := host.NewServer(b, info, nil, host.Config{PayloadBudget: budget})
	t.Cleanup(s.Close)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := readAdmittedBody(w, r, s)
		if err != nil {
			run.WriteError(w, err.(*apiError))
			return
		}
		fmt.Fprint(w, len(body))
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewServer(h, ServerOptions{ChunkTimeout: time.Second})
	go hs.Serve(LimitListener(l, 4))
	t.Cleanup(func() { hs.Close() })
	return s, "http://" + l.Addr().String()
}

func TestBodyAdmittedThroughTheBudget(t *testing.T) {
	s, url := budgetServer(t, 1<<20)
	// A body held open mid-way keeps its announced length taken.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", url, pr)
	req.ContentLength = 800 << 10
	go http.DefaultClient.Do(req)
	pw.Write(make([]byte, 100<<10))
	waitUntil(t, func() bool { return s.PayloadBudgetInUse() == 800<<10 })
	// Larger than the whole budget: refused at once.
	resp, err := http.Post(url, "application/json", strings.NewReader(strings.Repeat(" ", 2<<20)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over the budget: %d", resp.StatusCode)
	}
	pw.Close()
	waitUntil(t, func() bool { return s.PayloadBudgetInUse() == 0 })
}

func TestBodyWaitsForTheBudget(t *testing.T) {
	s, url := budgetServer(t, 1<<20)
	release, err := s.AdmitPayload(context.Background(), 900<<10)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	go func() { time.Sleep(300 * time.Millisecond); release() }()
	resp, err := http.Post(url, "application/json", strings.NewReader(strings.Repeat(" ", 500<<10)))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != fmt.Sprint(500<<10) || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("%d %s after %v", resp.StatusCode, b, time.Since(start))
	}
}

func TestConnectionsBeyondTheLimitGet503(t *testing.T) {
	_, url := budgetServer(t, 1<<20)
	addr := strings.TrimPrefix(url, "http://")
	for range 4 { // hold every allowed connection
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 503 ") || !strings.Contains(string(b), "Retry-After: 1") {
		t.Fatalf("%q %v", b, err)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met in 5 s")
}
