package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseAllowList(t *testing.T) {
	list, err := ParseAllowList([]string{"10.0.0.0/8", " 192.168.1.7 ,fd00::/64", "::ffff:172.16.0.0/108", "", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := list.String(), "10.0.0.0/8,192.168.1.7/32,fd00::/64,172.16.0.0/12,::1/128"; got != want {
		t.Fatalf("list %s, want %s", got, want)
	}
	for _, c := range []struct {
		peer string
		ok   bool
	}{
		{"10.200.3.4", true},
		{"::ffff:10.200.3.4", true}, // an IPv4 peer on a dual-stack listener
		{"11.0.0.1", false},
		{"192.168.1.7", true},
		{"192.168.1.8", false},
		{"fd00::1234", true},
		{"fd00:0:0:1::1", false},
		{"fe80::1%eth0", false},
		{"172.31.255.255", true},
		{"172.32.0.0", false},
		{"::1", true},
		{"127.0.0.1", false}, // loopback is not implied
	} {
		if got := list.Allows(netip.MustParseAddr(c.peer)); got != c.ok {
			t.Errorf("Allows(%s) = %v, want %v", c.peer, got, c.ok)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0", "fe80::1%eth0", "::ffff:10.0.0.0/80", "10.0.0.1/8/2"} {
		if _, err := ParseAllowList([]string{bad}); err == nil || !strings.Contains(err.Error(), "allow-list entry") {
			t.Errorf("ParseAllowList(%q) error %v", bad, err)
		}
	}
	if l, err := ParseAllowList(nil); err != nil || len(l) != 0 {
		t.Fatalf("empty list: %v %v", l, err)
	}
}

// TestAllowPeersRefusesOthers: a peer outside the list finds its connection
// closed without a byte read; an allowed one is served; the refusals are
// reported once, with their count.
func TestAllowPeersRefusesOthers(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reports []int
	l := AllowPeers(inner, AllowList{netip.MustParsePrefix("127.0.0.2/32")}, func(peer string, n int) {
		if !strings.HasPrefix(peer, "127.0.0.1:") {
			t.Errorf("refused peer %q", peer)
		}
		mu.Lock()
		reports = append(reports, n)
		mu.Unlock()
	})
	defer l.Close()
	echoServe(t, l)

	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		c.Write([]byte("hello"))
		if n, err := c.Read(make([]byte, 8)); n != 0 || err == nil || isTimeout(err) {
			t.Fatalf("a refused peer read %d bytes, %v", n, err)
		}
		c.Close()
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("allowed peer: %q %v", buf, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 1 || reports[0] != 1 {
		t.Fatalf("reports %v: want the first refusal reported at once and the rest held back", reports)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestAllowPeersReportsHeldBackCount: the report after the interval carries
// every refusal since the previous one.
func TestAllowPeersReportsHeldBackCount(t *testing.T) {
	var got []int
	l := &allowListener{refused: func(_ string, n int) { got = append(got, n) }}
	for range 4 {
		l.report("p")
	}
	l.reported = l.reported.Add(-RefusedLogInterval)
	l.report("p")
	if len(got) != 2 || got[0] != 1 || got[1] != 4 {
		t.Fatalf("reports %v, want [1 4]", got)
	}
}

func TestLoopbackOnly(t *testing.T) {
	defer func(f func(context.Context, string, string) ([]netip.Addr, error)) { lookupNetIP = f }(lookupNetIP)
	lookupNetIP = func(_ context.Context, _, host string) ([]netip.Addr, error) {
		switch host {
		case "local.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
		case "mixed.test":
			return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.0.0.3")}, nil
		}
		return nil, errors.New("no such host")
	}
	for _, c := range []struct {
		url string
		ok  bool
		err string
	}{
		{url: "tcp://127.0.0.1:9510", ok: true},
		{url: "tcp://127.8.9.10:9510", ok: true},
		{url: "tcp://[::1]:9510", ok: true},
		{url: "tls://[::ffff:127.0.0.1]:9510", ok: true},
		{url: "unix:///run/hydra.sock", ok: true},
		{url: "tcp://local.test:9510", ok: true},
		{url: "tcp://0.0.0.0:9510"},
		{url: "tcp://:9510"},
		{url: "tcp://[::]:9510"},
		{url: "tls://192.168.1.5:9510"},
		{url: "tcp://mixed.test:9510"},
		{url: "tcp://nowhere.test:9510", err: "resolving"},
	} {
		ok, err := LoopbackOnly(context.Background(), c.url)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.url, err, c.err)
			}
			continue
		}
		if err != nil || ok != c.ok {
			t.Errorf("%s: %v %v, want %v", c.url, ok, err, c.ok)
		}
	}
}
