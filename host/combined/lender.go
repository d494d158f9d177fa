package combined

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
)

// PollEvery is how often a lender re-reads what its backend lends, beside
// the nudges of the swaps it serves: a plugin restarted by the supervisor
// or gone down changes it without one.
const PollEvery = time.Second

// helloTimeout bounds how long a connection may take to say Hello.
const helloTimeout = 5 * time.Second

// Lender serves what an engine lends to the heads that connect.
type Lender struct {
	lend func(context.Context) (iface.WeightRegistry, error)
	log  hclog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	changed chan struct{} // closed by Nudge
	heads   int
}

// NewLender is a lender of what lend returns.
func NewLender(lend func(context.Context) (iface.WeightRegistry, error), log hclog.Logger) *Lender {
	ctx, cancel := context.WithCancel(context.Background())
	return &Lender{lend: lend, log: log, ctx: ctx, cancel: cancel, changed: make(chan struct{})}
}

// Nudge makes every connection re-read what is lent now (after a swap).
func (l *Lender) Nudge() {
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// Heads is the number of heads connected.
func (l *Lender) Heads() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.heads
}

// Serve accepts heads on ln until Close.
func (l *Lender) Serve(ln net.Listener) error {
	l.wg.Add(1)
	defer l.wg.Done()
	go func() { <-l.ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.serveConn(c)
		}()
	}
}

// Close stops serving and closes every connection.
func (l *Lender) Close() {
	l.cancel()
	l.wg.Wait()
}

func (l *Lender) serveConn(c net.Conn) {
	defer c.Close()
	log := l.log.With("head", c.RemoteAddr().String())
	if err := readHello(c); err != nil {
		log.Warn("combined: a connection to the lending port that is not a head's", "error", err)
		return
	}
	ctx, cancel := context.WithCancel(l.ctx)
	defer cancel()
	// The head sends nothing after Hello: a read returning is its close.
	go func() {
		_, _ = io.Copy(io.Discard, c)
		cancel()
	}()
	go func() { <-ctx.Done(); c.Close() }()
	l.count(+1)
	defer l.count(-1)
	log.Info("combined: a head is following this engine's weights")
	last := ""
	for {
		l.mu.Lock()
		changed := l.changed
		l.mu.Unlock()
		// A registry is told by its generation: encoded only when it
		// changed, not at every poll.
		m := l.message(ctx)
		if key := m.key(); key != last {
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(m.line()); err != nil {
				if ctx.Err() == nil {
					log.Warn("combined: writing to the head", "error", err)
				}
				return
			}
			last = key
		}
		select {
		case <-ctx.Done():
			log.Info("combined: the head left")
			return
		case <-changed:
		case <-time.After(PollEvery):
		}
	}
}

func (l *Lender) count(d int) {
	l.mu.Lock()
	l.heads += d
	l.mu.Unlock()
}

// message is what is lent now.
func (l *Lender) message(ctx context.Context) Message {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	reg, err := l.lend(ctx)
	if err == nil {
		err = reg.Check()
	}
	if err != nil {
		return Message{Error: "this engine lends no weights: " + err.Error()}
	}
	return Message{Registry: &reg}
}

func readHello(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(helloTimeout))
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len(Hello))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != Hello {
		return fmt.Errorf("first bytes %q, not %q", buf, Hello)
	}
	return nil
}
