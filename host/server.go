// Package host is the engine process: it owns the Hydra sockets, the
// engine-wide tunables and the slots, and streams state bytes between the
// sockets and the backend plugin.
package host

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/trace"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Config holds the server's limits. Zero values take the defaults.
type Config struct {
	Logger hclog.Logger
	// Version is reported by INFO and /version.
	Version string
	// IdleTimeout closes a connection idle between requests (default 120 s).
	IdleTimeout time.Duration
	// ChunkTimeout bounds each read or write inside a request or reply
	// (default 900 s): a stalled peer is cut off, a moving transfer never is.
	ChunkTimeout time.Duration
	// MaxStateBytes caps a STATE_PUT payload (default 4 GiB).
	MaxStateBytes uint64
	// MaxJSONBytes caps every other payload (default 16 MiB).
	MaxJSONBytes uint64
	// SocketBuffer is the SO_SNDBUF/SO_RCVBUF asked for on accepted
	// connections: 0 means DefaultUnixSocketBuffer on Unix sockets and the
	// kernel's autotuning on TCP, < 0 the kernel's defaults everywhere.
	SocketBuffer int
	// MaxConns caps the connections open at once on each listener (default
	// DefaultMaxConns); one beyond it is answered BUSY and closed.
	MaxConns int
	// PayloadBudget caps the bytes of request payloads buffered in memory at
	// once, over all connections and the HTTP API (default
	// DefaultPayloadBudget).
	PayloadBudget uint64
	// MinTransferRate is the slowest, in bytes per second, a request or a
	// reply may move inside a request (default DefaultMinTransferRate; < 0
	// turns the check off).
	MinTransferRate int64
	// TransferFloor, in bytes per second, is the slowest a state transfer of
	// FloorMinBytes or more may move before it is logged as a warning (0:
	// none).
	TransferFloor uint64
	// StateShmDir is the directory, shared memory (a tmpfs), where
	// STATE_EXPORT writes the blobs it hands to another engine on this host
	// and from which STATE_IMPORT reads them (default DefaultStateShmDir).
	StateShmDir string
	// TracerProvider makes a span of every request (host/tracing); nil:
	// traces are off.
	TracerProvider trace.TracerProvider
}

// Defaults.
const (
	DefaultStateShmDir   = "/dev/shm"
	DefaultIdleTimeout   = 120 * time.Second
	DefaultChunkTimeout  = 900 * time.Second
	DefaultMaxStateBytes = 4 << 30
	DefaultMaxJSONBytes  = 16 << 20

	DefaultMaxConns        = 1024
	DefaultPayloadBudget   = 256 << 20
	DefaultMinTransferRate = 1 << 20
)

func (c *Config) fill() {
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.ChunkTimeout == 0 {
		c.ChunkTimeout = DefaultChunkTimeout
	}
	if c.MaxStateBytes == 0 {
		c.MaxStateBytes = DefaultMaxStateBytes
	}
	if c.MaxJSONBytes == 0 {
		c.MaxJSONBytes = DefaultMaxJSONBytes
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
}

// Server serves the Hydra RPC protocol over any number of listeners.
type Server struct {
	cfg    Config
	log    hclog.Logger
	tun    *Tunables
	slots  *slotTable
	stats  *Stats
	budget *payloadBudget
	models models
	tracer trace.Tracer // nil: traces are off

	mu      sync.RWMutex
	backend iface.Backend
	info    iface.BackendInfo

	// ctx is the requests' context: cancelled only when a shutdown's grace
	// runs out. stopping closes when the shutdown starts.
	ctx       context.Context
	cancel    context.CancelFunc
	stopping  chan struct{}
	stopOnce  sync.Once
	wg        sync.WaitGroup
	connMu    sync.Mutex
	conns     map[net.Conn]struct{}
	listeners map[net.Listener]struct{}

	peer peering // combined mode between engines (ops_combined.go)
}

// NewServer returns a server over a loaded backend. tun may be shared with a
// previous server; nil means defaults.
func NewServer(b iface.Backend, info iface.BackendInfo, tun *Tunables, cfg Config) *Server {
	cfg.fill()
	if tun == nil {
		tun = NewTunables()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, log: cfg.Logger, tun: tun, slots: newSlotTable(info.NSlots), stats: newStats(),
		budget:  newPayloadBudget(cfg.PayloadBudget),
		backend: b, info: info, ctx: ctx, cancel: cancel, stopping: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, listeners: map[net.Listener]struct{}{},
	}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracing.Scope)
	}
	s.refreshSlots()
	return s
}

// refreshSlots fills the slot table's cached figures from the backend.
func (s *Server) refreshSlots() {
	b, info := s.Backend()
	for i := 0; i < info.NSlots; i++ {
		si, err := b.Slot(s.ctx, i)
		if err != nil {
			s.log.Warn("reading slot", "slot", i, "error", err)
			continue
		}
		s.slots.update(i, si)
	}
}

// Tunables returns the engine-wide tunables.
func (s *Server) Tunables() *Tunables { return s.tun }

// Stats returns the transfer counters.
func (s *Server) Stats() *Stats { return s.stats }

// Config returns the server's configuration, defaults filled in.
func (s *Server) Config() Config { return s.cfg }

// RPCActive reports whether the server accepts Hydra RPC connections: it
// has a listener and is not shutting down.
func (s *Server) RPCActive() bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	return !s.isStopping() && len(s.listeners) > 0
}

// Backend returns the current backend and what it reported at load.
func (s *Server) Backend() (iface.Backend, iface.BackendInfo) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.backend, s.info
}

// SetBackend swaps in a (re)loaded backend; all slots start empty. The
// table is suspended before the swap, so that no request that took its slot
// from the old backend reaches the new one.
func (s *Server) SetBackend(b iface.Backend, info iface.BackendInfo) {
	s.slots.suspend()
	s.mu.Lock()
	s.backend, s.info = b, info
	s.mu.Unlock()
	s.slots.reset(info.NSlots)
	s.refreshSlots()
	s.rebindPeer()
}

// Serve accepts connections on l until the listener closes, and serves each
// in its own goroutine. A failing Accept is retried with backoff
// (acceptRetry); a connection beyond cfg.MaxConns open on l is answered BUSY
// and closed (connLimit). It returns nil once Shutdown closed l, and the
// listener's error when something else closed it.
func (s *Server) Serve(l net.Listener) error {
	if !s.addListener(l) {
		return net.ErrClosed
	}
	defer s.removeListener(l)
	log := s.log.With("listener", l.Addr().String())
	limit := newConnLimit(s.cfg.MaxConns)
	retry := &acceptRetry{log: log}
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isStopping() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			s.stats.acceptError()
			if !s.pause(retry.failed(err)) {
				return nil
			}
			continue
		}
		retry.succeeded()
		if !limit.take() {
			s.stats.connRefused()
			limit.refuse(c, log)
			continue
		}
		if !s.track(c, limit.release) {
			return nil
		}
	}
}

func (s *Server) addListener(l net.Listener) bool {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.isStopping() {
		return false
	}
	s.listeners[l] = struct{}{}
	return true
}

func (s *Server) removeListener(l net.Listener) {
	s.connMu.Lock()
	delete(s.listeners, l)
	s.connMu.Unlock()
}

// pause waits d, or until a shutdown starts; false then.
func (s *Server) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.stopping:
		return false
	}
}

// track registers c and serves it in a goroutine of its own, calling
// release when it is done; false (c closed, released) when the server is
// stopping.
func (s *Server) track(c net.Conn, release func()) bool {
	s.connMu.Lock()
	if s.isStopping() {
		s.connMu.Unlock()
		c.Close()
		release()
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1)
	s.connMu.Unlock()
	s.stats.connOpened(1)
	go func() {
		defer s.wg.Done()
		s.serveConn(c)
		s.connMu.Lock()
		delete(s.conns, c)
		s.connMu.Unlock()
		s.stats.connOpened(-1)
		release()
	}()
	return true
}

// Shutdown stops accepting, lets connections finish the request they are
// in for up to grace (idle ones close at once), then cancels what is left
// and closes every connection. It returns how many requests the grace cut
// short: the connections still open when it ran out, since the idle ones
// were woken at its start and each connection serves one request at a time.
func (s *Server) Shutdown(grace time.Duration) (cut int) {
	s.connMu.Lock()
	s.stopOnce.Do(func() { close(s.stopping) })
	for l := range s.listeners {
		l.Close()
	}
	// Idle connections wait in a header read: wake them so they exit. A
	// request in progress re-arms its own deadlines.
	for c := range s.conns {
		c.SetReadDeadline(time.Now())
	}
	s.connMu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.cancel()
		s.connMu.Lock()
		cut = len(s.conns)
		for c := range s.conns {
			c.Close()
		}
		s.connMu.Unlock()
		<-done
	}
	s.cancel()
	s.closePeering()
	return cut
}

func (s *Server) isStopping() bool {
	select {
	case <-s.stopping:
		return true
	default:
		return false
	}
}

// Close shuts down without a grace period.
func (s *Server) Close() { s.Shutdown(0) }
