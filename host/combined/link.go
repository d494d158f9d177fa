package combined

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Reconnect bounds: a head retries a peer that is down from the first
// to the last delay, doubling.
const (
	firstRetry = 250 * time.Millisecond
	lastRetry  = 5 * time.Second
)

// State is what a head knows of its peer now.
type State struct {
	Connected bool
	// Registry is what the peer lends; nil when it lends nothing now.
	Registry *iface.WeightRegistry
	// Why is why Registry is nil.
	Why string
}

// Link follows a peer's lent weights: it stays connected, reconnecting
// after the peer goes (a restart), and calls the function given to Start
// with each new State.
type Link struct {
	addr string
	log  hclog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	state State
}

// NewLink is a link to the peer at addr (HOST:PORT), not yet started.
func NewLink(addr string, log hclog.Logger) *Link {
	ctx, cancel := context.WithCancel(context.Background())
	return &Link{addr: addr, log: log, ctx: ctx, cancel: cancel, done: make(chan struct{}),
		state: State{Why: "not connected to the peer " + addr + " yet"}}
}

// Addr is the peer's address.
func (k *Link) Addr() string { return k.addr }

// State is what is known of the peer now.
func (k *Link) State() State {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.state
}

// Start follows the peer until Close, calling changed (from one goroutine,
// never two at once) with every new State.
func (k *Link) Start(changed func(State)) {
	go func() {
		defer close(k.done)
		delay := firstRetry
		for k.ctx.Err() == nil {
			err := k.follow(changed, func() { delay = firstRetry })
			if k.ctx.Err() != nil {
				return
			}
			k.set(State{Why: fmt.Sprintf("the peer %s: %v", k.addr, err)}, changed)
			select {
			case <-k.ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, lastRetry)
		}
	}()
}

// Close stops following.
func (k *Link) Close() {
	k.cancel()
	<-k.done
}

// follow connects once and reads the peer's messages until the connection
// fails; connected is called once the peer has answered.
func (k *Link) follow(changed func(State), connected func()) error {
	var d net.Dialer
	dctx, cancel := context.WithTimeout(k.ctx, 5*time.Second)
	c, err := d.DialContext(dctx, "tcp", k.addr)
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(k.ctx, func() { c.Close() })
	defer stop()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(Hello)); err != nil {
		return err
	}
	r := bufio.NewReaderSize(c, 64<<10)
	first := true
	for {
		m, err := readMessage(r)
		if err != nil {
			if first {
				return fmt.Errorf("no answer to %q (is it an engine lending its weights, llama-engine's --ggml-rpc-port?): %w", Hello[:len(Hello)-1], err)
			}
			return fmt.Errorf("connection lost: %w", err)
		}
		if first {
			connected()
			first = false
		}
		st := State{Connected: true, Registry: m.Registry, Why: m.Error}
		k.set(st, changed)
	}
}

func (k *Link) set(st State, changed func(State)) {
	k.mu.Lock()
	old := k.state
	k.state = st
	k.mu.Unlock()
	if st.Connected != old.Connected || st.Why != old.Why || generation(st) != generation(old) {
		switch {
		case st.Registry != nil:
			k.log.Info("combined: the peer lends its weights", "peer", k.addr, "generation", st.Registry.Generation, "weights", len(st.Registry.Weights))
		case old.Connected || old.Registry != nil:
			k.log.Warn("combined: the peer lends nothing now", "peer", k.addr, "why", st.Why)
		}
		changed(st)
	}
}

func generation(s State) string {
	if s.Registry == nil {
		return ""
	}
	return s.Registry.Generation
}
