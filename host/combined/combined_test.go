package combined

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

// lent is a lend function whose answer the test changes.
type lent struct {
	mu  sync.Mutex
	reg iface.WeightRegistry
	err error
}

func (l *lent) set(reg iface.WeightRegistry, err error) {
	l.mu.Lock()
	l.reg, l.err = reg, err
	l.mu.Unlock()
}

func (l *lent) lend(context.Context) (iface.WeightRegistry, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reg, l.err
}

func registry(gen string) iface.WeightRegistry {
	return iface.WeightRegistry{Generation: gen, Arch: "qwen35moe", Weights: []iface.LentWeight{
		{Name: "blk.0.ffn_up_exps.weight", Type: "q4_0", Shape: []int64{64, 32, 4}, Bytes: 4608, Device: "CPU", File: "/m.gguf", Offset: 4096},
	}}
}

func startLender(t *testing.T, l *lent) (*Lender, string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewLender(l.lend, hclog.NewNullLogger())
	go s.Serve(ln)
	t.Cleanup(s.Close)
	return s, ln.Addr().String()
}

// states collects a link's states.
type states struct {
	ch chan State
}

func follow(t *testing.T, addr string) (*Link, *states) {
	k := NewLink(addr, hclog.NewNullLogger())
	s := &states{ch: make(chan State, 100)}
	k.Start(func(st State) { s.ch <- st })
	t.Cleanup(k.Close)
	return k, s
}

// next waits for a state that ok accepts.
func (s *states) next(t *testing.T, what string, ok func(State) bool) State {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case st := <-s.ch:
			if ok(st) {
				return st
			}
		case <-deadline:
			t.Fatalf("no state where %s", what)
		}
	}
}

func hasGen(g string) func(State) bool {
	return func(s State) bool { return s.Connected && s.Registry != nil && s.Registry.Generation == g }
}

// TestLinkFollowsLender: the head learns the registry at once, a swap's
// nudge brings the next generation, a backend that lends nothing is said
// with its reason, and the peer's restart is a lost connection, then the
// new registry.
func TestLinkFollowsLender(t *testing.T) {
	l := &lent{reg: registry("a/1")}
	srv, addr := startLender(t, l)
	k, st := follow(t, addr)
	st.next(t, "generation a/1", hasGen("a/1"))
	if got := k.State(); got.Registry == nil || got.Registry.Weights[0].Offset != 4096 {
		t.Fatalf("state %+v", got)
	}

	l.set(registry("a/2"), nil)
	srv.Nudge()
	st.next(t, "generation a/2", hasGen("a/2"))

	l.set(iface.WeightRegistry{}, errors.New("the plugin is down"))
	got := st.next(t, "nothing lent", func(s State) bool { return s.Connected && s.Registry == nil })
	if !strings.Contains(got.Why, "the plugin is down") {
		t.Fatalf("why %q", got.Why)
	}

	// A registry that breaks iface's bounds is not lent.
	bad := registry("a/3")
	bad.Weights[0].Shape = nil
	l.set(bad, nil)
	srv.Nudge()
	got = st.next(t, "a bad registry refused", func(s State) bool { return strings.Contains(s.Why, "shape") })
	if got.Registry != nil {
		t.Fatal("a bad registry was lent")
	}

	// The peer restarts on the same port.
	srv.Close()
	st.next(t, "the connection lost", func(s State) bool { return !s.Connected })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skip("the port was taken meanwhile:", err)
	}
	l.set(registry("b/1"), nil)
	srv2 := NewLender(l.lend, hclog.NewNullLogger())
	go srv2.Serve(ln)
	defer srv2.Close()
	st.next(t, "generation b/1 after the restart", hasGen("b/1"))
	if srv2.Heads() != 1 {
		t.Fatalf("heads %d", srv2.Heads())
	}
}

// TestLinkPeerDown: nothing listening is said, and retried.
func TestLinkPeerDown(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	_, st := follow(t, addr)
	got := st.next(t, "a refused connection", func(s State) bool { return !s.Connected && s.Why != "" })
	if !strings.Contains(got.Why, addr) {
		t.Fatalf("why %q names no peer", got.Why)
	}
}

// TestLinkRefusesBadPeers: a peer that is not a lender, or sends what the
// wire does not allow, leaves the head with nothing lent and the reason.
func TestLinkRefusesBadPeers(t *testing.T) {
	for name, reply := range map[string]string{
		"silent close":     "",
		"not json":         "HTTP/1.1 400 Bad Request\r\n\r\n",
		"both":             `{"registry":{"generation":"g","arch":"","weights":[]},"error":"x"}` + "\n",
		"neither":          "{}\n",
		"unknown field":    `{"registry":{"generation":"g","arch":"","weights":[]},"extra":1}` + "\n",
		"no generation":    `{"registry":{"generation":"","arch":"","weights":[]}}` + "\n",
		"negative offset":  `{"registry":{"generation":"g","arch":"","weights":[{"name":"w","type":"f16","shape":[2],"bytes":4,"device":"CPU","file":"/f","offset":-1}]}}` + "\n",
		"twice one weight": `{"registry":{"generation":"g","arch":"","weights":[{"name":"w","type":"f16","shape":[2],"bytes":4,"device":"CPU"},{"name":"w","type":"f16","shape":[2],"bytes":4,"device":"CPU"}]}}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						bufio.NewReader(c).ReadString('\n')
						c.Write([]byte(reply))
					}()
				}
			}()
			k, st := follow(t, ln.Addr().String())
			got := st.next(t, "a refusal", func(s State) bool { return !s.Connected && s.Why != "" })
			if got.Registry != nil || k.State().Registry != nil {
				t.Fatal("a registry was taken from a bad peer")
			}
		})
	}
}

// TestLenderRefusesStrangers: a connection that does not say Hello is
// closed; a lender serves several heads.
func TestLenderRefusesStrangers(t *testing.T) {
	l := &lent{reg: registry("a/1")}
	srv, addr := startLender(t, l)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 10)); err == nil {
		t.Fatalf("a stranger got %d bytes", n)
	}
	c.Close()
	_, s1 := follow(t, addr)
	_, s2 := follow(t, addr)
	s1.next(t, "head 1 served", hasGen("a/1"))
	s2.next(t, "head 2 served", hasGen("a/1"))
	if srv.Heads() != 2 {
		t.Fatalf("heads %d", srv.Heads())
	}
}

// FuzzReadMessage: any bytes from a peer give a checked message or an
// error, never a panic or a registry outside iface's bounds.
func FuzzReadMessage(f *testing.F) {
	line, _ := Message{Registry: ptr(registry("g"))}.encode()
	f.Add(line)
	f.Add([]byte(`{"error":"down"}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readMessage(bufio.NewReader(strings.NewReader(string(b))))
		if err != nil {
			return
		}
		if m.Registry != nil {
			if err := m.Registry.Check(); err != nil {
				t.Fatalf("accepted a registry that fails its check: %v", err)
			}
		} else if m.Error == "" {
			t.Fatal("accepted an empty message")
		}
	})
}

func ptr[T any](v T) *T { return &v }
