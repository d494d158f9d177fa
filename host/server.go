// Package host is the engine process: it owns the Hydra sockets, the
// engine-wide tunables and the slots, and streams state bytes between the
// sockets and the backend plugin.
package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
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
}

// Defaults.
const (
	DefaultIdleTimeout   = 120 * time.Second
	DefaultChunkTimeout  = 900 * time.Second
	DefaultMaxStateBytes = 4 << 30
	DefaultMaxJSONBytes  = 16 << 20
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
}

// Server serves the Hydra RPC protocol over any number of listeners.
type Server struct {
	cfg   Config
	log   hclog.Logger
	tun   *Tunables
	slots *slotTable
	stats *Stats

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
		backend: b, info: info, ctx: ctx, cancel: cancel, stopping: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, listeners: map[net.Listener]struct{}{},
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

// SetBackend swaps in a (re)loaded backend; all slots start empty.
func (s *Server) SetBackend(b iface.Backend, info iface.BackendInfo) {
	s.mu.Lock()
	s.backend, s.info = b, info
	s.mu.Unlock()
	s.slots.reset(info.NSlots)
	s.refreshSlots()
}

// Serve accepts connections on l until Close; each gets its own goroutine.
func (s *Server) Serve(l net.Listener) error {
	s.connMu.Lock()
	if s.isStopping() {
		s.connMu.Unlock()
		return net.ErrClosed
	}
	s.listeners[l] = struct{}{}
	s.connMu.Unlock()
	defer func() {
		s.connMu.Lock()
		delete(s.listeners, l)
		s.connMu.Unlock()
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			if s.isStopping() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		s.connMu.Lock()
		if s.isStopping() {
			s.connMu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.connMu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.connMu.Lock()
			delete(s.conns, c)
			s.connMu.Unlock()
		}()
	}
}

// Shutdown stops accepting, lets connections finish the request they are
// in for up to grace (idle ones close at once), then cancels what is left
// and closes every connection.
func (s *Server) Shutdown(grace time.Duration) {
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
	select {
	case <-done:
	case <-time.After(grace):
		s.cancel()
		s.connMu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.connMu.Unlock()
		<-done
	}
	s.cancel()
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

// request is one parsed request; Payload yields exactly hdr.PayloadLen bytes.
type request struct {
	hdr     transport.RequestHeader
	key     string
	trace   string
	payload *io.LimitedReader
	conn    *deadlineConn // the socket under payload, nil in tests
}

// readPayload reads the whole payload, which the caller has bounded.
func (r *request) readPayload() ([]byte, error) {
	b := make([]byte, r.payload.N)
	_, err := io.ReadFull(r.payload, b)
	return b, err
}

// errFatal marks a failure after which the connection cannot stay in sync:
// the reply was already started, or the peer is gone.
type errFatal struct{ err error }

func (e errFatal) Error() string { return e.err.Error() }
func (e errFatal) Unwrap() error { return e.err }

// replier writes one response. Every reply is fully framed.
type replier struct {
	w       *bufio.Writer
	sent    bool
	status  transport.Status
	network string // the client's socket ("tcp", "unix"), for logs
}

// header writes the response header and meta; payloadLen bytes must follow.
func (r *replier) header(st transport.Status, meta []byte, payloadLen uint64) error {
	if r.sent {
		return errFatal{errors.New("host: second reply to one request")}
	}
	r.sent, r.status = true, st
	if err := transport.CheckMetaLen(len(meta)); err != nil {
		return errFatal{err}
	}
	var hb [transport.ResponseHeaderSize]byte
	h := transport.AppendResponseHeader(hb[:0], transport.ResponseHeader{Status: st, MetaLen: uint32(len(meta)), PayloadLen: payloadLen})
	if _, err := r.w.Write(h); err != nil {
		return errFatal{err}
	}
	if _, err := r.w.Write(meta); err != nil {
		return errFatal{err}
	}
	return nil
}

// reply writes a whole reply with an in-memory payload.
func (r *replier) reply(st transport.Status, meta, payload []byte) error {
	if err := r.header(st, meta, uint64(len(payload))); err != nil {
		return err
	}
	if _, err := r.w.Write(payload); err != nil {
		return errFatal{err}
	}
	return nil
}

// fail replies with status and {"error":msg}.
func (r *replier) fail(st transport.Status, msg string) error {
	return r.reply(st, transport.ErrorMeta(msg), nil)
}

// failErr replies to a backend or slot error with the status it maps to.
func (r *replier) failErr(err error) error {
	return r.fail(statusOf(err), err.Error())
}

// statusOf maps an error to the status the protocol gives it.
func statusOf(err error) transport.Status {
	switch {
	case errors.Is(err, iface.ErrNoSlot):
		return transport.StatusNotFound
	case errors.Is(err, iface.ErrBusy):
		return transport.StatusBusy
	case errors.Is(err, iface.ErrNotImplemented):
		return transport.StatusNotImplemented
	default:
		return transport.StatusError
	}
}

func (s *Server) serveConn(raw net.Conn) {
	defer raw.Close()
	log := s.log.With("remote", raw.RemoteAddr().String())
	if err := SetSocketBuffers(raw, s.cfg.SocketBuffer); err != nil {
		log.Warn("setting the socket buffers", "error", err)
	}
	dc := &deadlineConn{Conn: raw, readTimeout: s.cfg.ChunkTimeout, writeTimeout: s.cfg.ChunkTimeout}
	br := bufio.NewReaderSize(dc, 64<<10)
	bw := bufio.NewWriterSize(dc, 64<<10)
	var hb [transport.RequestHeaderSize]byte
	for {
		// Between requests only the idle timeout applies.
		dc.readTimeout = 0
		if err := raw.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil {
			return
		}
		if s.isStopping() {
			return
		}
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			if !errors.Is(err, io.EOF) && !s.isStopping() {
				log.Debug("connection closed while waiting for a request", "error", err)
			}
			return
		}
		dc.readTimeout = s.cfg.ChunkTimeout
		hdr, err := transport.ParseRequestHeader(hb[:])
		if err != nil {
			log.Warn("closing connection", "error", err, "bytes", fmt.Sprintf("% x", hb[:4]))
			return
		}
		kt := make([]byte, int(hdr.KeyLen)+int(hdr.TraceLen))
		if _, err := io.ReadFull(br, kt); err != nil {
			log.Debug("connection closed inside a request", "error", err)
			return
		}
		req := &request{
			hdr: hdr, key: string(kt[:hdr.KeyLen]), trace: string(kt[hdr.KeyLen:]),
			payload: &io.LimitedReader{R: payloadReader{br, dc}, N: int64(min(hdr.PayloadLen, 1<<62))},
			conn:    dc,
		}
		if hdr.PayloadLen > 1<<62 {
			log.Warn("closing connection: payload length beyond any limit", "op", hdr.Op, "payload_len", hdr.PayloadLen)
			return
		}
		rp := &replier{w: bw, network: raw.LocalAddr().Network()}
		start := time.Now()
		err = s.dispatch(req, rp)
		if err == nil && !rp.sent {
			err = errFatal{fmt.Errorf("host: %v sent no reply", hdr.Op)}
		}
		s.stats.request(hdr.Op, rp.status, err != nil, time.Since(start))
		if err != nil {
			log.Warn("request aborted, closing connection", "op", hdr.Op, "key", req.key, "trace", req.trace, "error", err)
			return
		}
		// The reply goes out first, so a client refused early learns it
		// before sending the rest.
		if err := bw.Flush(); err != nil {
			log.Debug("connection closed while replying", "op", hdr.Op, "error", err)
			return
		}
		// Whatever the handler left unread is drained, so a refused or
		// unknown request never desyncs the connection.
		if req.payload.N > 0 {
			if _, err := io.Copy(io.Discard, req.payload); err != nil {
				log.Debug("connection closed while draining a payload", "op", hdr.Op, "error", err)
				return
			}
		}
		log.Trace("request served", "op", hdr.Op, "key", req.key, "trace", req.trace, "elapsed", time.Since(start))
	}
}

// dispatch runs one request. A returned error closes the connection.
func (s *Server) dispatch(req *request, rp *replier) error {
	op := req.hdr.Op
	if op != transport.OpStatePut && uint64(req.payload.N) > s.cfg.MaxJSONBytes {
		return rp.fail(transport.StatusError, fmt.Sprintf("%v payload of %d bytes exceeds the %d-byte limit", op, req.payload.N, s.cfg.MaxJSONBytes))
	}
	switch op {
	case transport.OpStateGet:
		return s.handleStateGet(req, rp)
	case transport.OpStatePut:
		return s.handleStatePut(req, rp)
	case transport.OpStateMeta:
		return s.handleStateMeta(req, rp)
	case transport.OpConfigure:
		return s.handleConfigure(req, rp)
	case transport.OpInfo:
		return s.handleInfo(req, rp)
	case transport.OpPrefill:
		return s.handlePrefill(req, rp)
	case transport.OpDecode:
		return s.handleDecode(req, rp)
	case transport.OpSetExpertMode:
		return s.handleSetExpertMode(req, rp)
	case transport.OpSwapQuant:
		return s.handleSwapQuant(req, rp)
	case transport.OpPipelineAttach:
		return rp.reply(transport.StatusNotImplemented, pipelineAttachMeta, nil)
	default:
		return rp.fail(transport.StatusNotImplemented, fmt.Sprintf("unknown opcode 0x%02X", uint8(op)))
	}
}

// pipelineAttachMeta is the C++ engine's reply, kept byte for byte (§10).
var pipelineAttachMeta = []byte(`{"error":"HYDRA_OP_PIPELINE_ATTACH not yet implemented in this build (see issue #287)","success":false}`)
