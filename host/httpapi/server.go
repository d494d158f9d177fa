package httpapi

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/host"
)

// ServerOptions are the HTTP server's limits.
type ServerOptions struct {
	// IdleTimeout closes a keep-alive connection idle between requests.
	IdleTimeout time.Duration
	// ChunkTimeout bounds each body read; the minimum rate's window is
	// host.RateWindow of it.
	ChunkTimeout time.Duration
	// MinTransferRate is the slowest a request body may arrive, in bytes
	// per second (0: host.DefaultMinTransferRate, < 0: no check).
	MinTransferRate int64
	// BaseContext, when set, is the context every request's derives from:
	// cancelling it with ErrShuttingDown as the cause cuts the requests in
	// progress, each telling its client why (a completion's stream ends
	// with that error), when a shutdown's grace has run out.
	BaseContext context.Context
}

// ErrShuttingDown is the cause a shutdown cancels the requests still in
// progress with, once its grace has run out.
var ErrShuttingDown = errors.New("the engine is shutting down: the request was cut at the end of the shutdown grace")

// shutdownCut is ErrShuttingDown when ctx ended because the shutdown cut
// its request, else err: a request cut that way is told so, not that the
// engine failed.
func shutdownCut(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), ErrShuttingDown) {
		return ErrShuttingDown
	}
	return err
}

// HTTP limits that no setting changes: a request's header must arrive
// within headerTimeout and fit in maxHeaderBytes (the API needs a method,
// a path and a bearer key, not net/http's 1 MiB).
const (
	headerTimeout  = 10 * time.Second
	maxHeaderBytes = 64 << 10
)

// NewServer returns the HTTP server of h under opts. It has no read or
// write timeout for the whole request: a streamed completion lasts as long
// as it decodes, and net/http cancels a handler's context when such a
// deadline passes. A body instead has to keep the minimum rate (RateBody).
func NewServer(h http.Handler, opts ServerOptions) *http.Server {
	rate := opts.MinTransferRate
	if rate == 0 {
		rate = host.DefaultMinTransferRate
	}
	window := host.RateWindow(opts.ChunkTimeout)
	hs := &http.Server{
		Handler:           rateBodies(h, rate, window, opts.ChunkTimeout),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       opts.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
	if base := opts.BaseContext; base != nil {
		hs.BaseContext = func(net.Listener) context.Context { return base }
	}
	return hs
}

// rateBodies makes every request body a rateBody.
func rateBodies(h http.Handler, rate int64, window, stall time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = &rateBody{ReadCloser: r.Body, rc: http.NewResponseController(w),
				rate: host.NewMinRate(rate, window), stall: stall}
		}
		h.ServeHTTP(w, r)
	})
}

// rateBody arms the connection's read deadline before every body read, as
// the Hydra connections do: the stall limit, or the end of the minimum
// rate's window of socket time. The deadline is cleared once the body ends,
// since net/http's read past the body would otherwise cancel a long
// streamed reply when it passes; after a failed read it stays past.
type rateBody struct {
	io.ReadCloser
	rc    *http.ResponseController
	rate  host.MinRate
	stall time.Duration
	done  bool
}

func (b *rateBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	now := time.Now()
	d := b.rate.Deadline(now)
	if b.stall > 0 && (d.IsZero() || now.Add(b.stall).Before(d)) {
		d = now.Add(b.stall)
	}
	if !d.IsZero() {
		if err := b.rc.SetReadDeadline(d); err != nil {
			return 0, err
		}
	}
	n, err := b.ReadCloser.Read(p)
	b.rate.Done(int64(n), time.Since(now))
	switch {
	case err == io.EOF:
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	case err != nil:
		// The body is broken: net/http's attempt to read the rest after
		// the handler must fail at once, which closes the connection.
		b.done = true
		b.rc.SetReadDeadline(time.Now())
	}
	return n, b.rate.Err(err)
}

// LimitListener accepts at most max connections of l at once (max <= 0: no
// limit). One beyond is answered 503 with Retry-After and closed, so a
// client learns why instead of waiting in the accept queue; at most
// maxRefusing are answered at once (each holds a descriptor for up to 2 s),
// and past that a connection is closed at once, so a flood cannot use the
// descriptors up through the refusals either.
func LimitListener(l net.Listener, max int) net.Listener {
	if max <= 0 {
		return l
	}
	return &limitListener{Listener: l, free: make(chan struct{}, max), refusing: make(chan struct{}, maxRefusing)}
}

// maxRefusing is as many refusals in progress as the Hydra listeners allow.
const maxRefusing = 64

type limitListener struct {
	net.Listener
	free     chan struct{} // one token per open connection
	refusing chan struct{} // one token per refusal being answered
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.free <- struct{}{}:
			return &limitedConn{Conn: c, release: func() { <-l.free }}, nil
		default:
			l.refuse(c)
		}
	}
}

// refuse answers c in a goroutine of its own, or closes it at once when
// maxRefusing refusals are in progress.
func (l *limitListener) refuse(c net.Conn) {
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		refuseConn(c)
	}()
}

// overLimitBody is the reply to a connection beyond the limit.
const overLimitBody = `{"error":{"message":"too many connections","type":"unavailable_error"}}` + "\n"

var overLimit = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
	"Connection: close\r\nContent-Length: " + strconv.Itoa(len(overLimitBody)) + "\r\n\r\n" + overLimitBody

// refuseConn answers 503 and closes. It reads what the client sent for a
// moment after its side is shut, so the close does not reset the
// connection before the client has read the reply.
func refuseConn(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, overLimit); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// limitedConn gives its token back on its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// CloseWrite keeps net/http's graceful close of a TCP connection.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// RateListener arms a write deadline before every write of its connections,
// as the Hydra connections have: the stall limit (opts.ChunkTimeout) or the
// end of the minimum rate's window of socket time, whichever comes first.
// A client that stops reading a streamed completion then fails the stream's
// next blocked write within a window, and its slot is freed, instead of
// holding the slot for as long as it keeps the connection open. Time spent
// between writes (a decode producing the next token) is not socket time, so
// a slow decode is never charged to the client.
func RateListener(l net.Listener, opts ServerOptions) net.Listener {
	rate := opts.MinTransferRate
	if rate == 0 {
		rate = host.DefaultMinTransferRate
	}
	return &rateListener{Listener: l, rate: rate, window: host.RateWindow(opts.ChunkTimeout), stall: opts.ChunkTimeout}
}

type rateListener struct {
	net.Listener
	rate   int64
	window time.Duration
	stall  time.Duration
}

func (l *rateListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &rateConn{Conn: c, rate: host.NewMinRate(l.rate, l.window), stall: l.stall}, nil
}

// rateConn is a connection whose writes keep a minimum rate (RateListener).
type rateConn struct {
	net.Conn
	mu    sync.Mutex // net/http writes from the handler and from its own goroutine
	rate  host.MinRate
	stall time.Duration
}

// Write writes p in pieces of at most a quarter of a window's due bytes,
// each under its own deadline, so that one large write to a client reading
// at the minimum rate does not outlast the window it started in.
func (c *rateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	piece := len(p)
	if due := c.rate.Due(); due > 0 {
		piece = int(max(min(due/4, int64(len(p))), 1))
	}
	written := 0
	for written < len(p) {
		n, err := c.writePiece(p[written:min(len(p), written+piece)])
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

func (c *rateConn) writePiece(p []byte) (int, error) {
	now := time.Now()
	d := c.rate.Deadline(now)
	if c.stall > 0 && (d.IsZero() || now.Add(c.stall).Before(d)) {
		d = now.Add(c.stall)
	}
	if err := c.Conn.SetWriteDeadline(d); err != nil { // the zero time clears an earlier one
		return 0, err
	}
	n, err := c.Conn.Write(p)
	c.rate.Done(int64(n), time.Since(now))
	return n, c.rate.Err(err)
}

// CloseWrite keeps net/http's graceful close of a TCP connection.
func (c *rateConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
