package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"time"
)

const (
	// copyBufSize is the largest payload copy buffer. State payloads are
	// ~1 GB; 1 MiB pieces keep the per-syscall cost negligible.
	copyBufSize = 1 << 20
	// readBufSize buffers response headers and meta. Larger body reads
	// bypass it (bufio reads straight into big destination slices).
	readBufSize = 64 << 10
	// inlinePayload is the largest payload sent in the same write as the
	// request header.
	inlinePayload = 64 << 10
	// callInitialBuf caps Call's first allocation for a reply payload, so a
	// bogus payload_len cannot allocate memory the server never sends.
	callInitialBuf = 64 << 20
)

var (
	// ErrUnreadBody is returned by Do while the previous response's Body still
	// has unread bytes. Read it to the end or call Response.Close first.
	ErrUnreadBody = errors.New("transport: previous response body not fully read; read it or call Response.Close")
	// ErrClientBroken wraps the failure that left a Client's connection out of
	// sync (an I/O error, a cancelled request, a short payload). Such a Client
	// only fails; dial a new one.
	ErrClientBroken = errors.New("transport: connection unusable after an earlier failure; dial a new client")
)

// aLongTimeAgo is a deadline in the past: setting it interrupts blocked I/O.
var aLongTimeAgo = time.Unix(1, 0)

// Client sends Hydra RPC requests over one connection, one at a time, as the
// protocol requires (no pipelining). A Client is not safe for concurrent use:
// one goroutine at a time issues a request and consumes its response (the
// Body may be handed to another goroutine, if the Client is left alone until
// the Body is consumed). Use one Client per connection of a pool for parallel
// requests.
//
// Any I/O failure, short request payload or context cancellation in the middle
// of a request leaves the stream out of sync; the Client then closes its
// connection and every later call fails with ErrClientBroken.
type Client struct {
	conn net.Conn
	br   *bufio.Reader
	wbuf []byte // request header, key and trace; reused
	cbuf []byte // payload copy buffer; grown on demand up to copyBufSize
	hdr  [ResponseHeaderSize]byte
	cur  *call // request in progress; set until its response body is consumed
	err  error // sticky; non-nil once the connection is unusable
}

// call is the lifetime of one request, from the first byte sent to the last
// byte of its response body.
type call struct {
	ctx  context.Context
	stop func() bool
	mu   sync.Mutex
	done bool
}

// Request is one request. Payload nil means an empty payload; otherwise
// exactly PayloadLen bytes are read from it (more are left unread, fewer is an
// error: before anything is sent for payloads up to 64 KiB, which are sent
// with the header; mid-stream, breaking the Client, for larger ones).
type Request struct {
	Op         Op
	Key        string
	Trace      string
	Payload    io.Reader
	PayloadLen uint64
}

// Response is a response whose meta has been read. Body yields exactly
// PayloadLen bytes; it must be consumed, or the Response closed, before the
// Client sends another request. Body also implements io.WriterTo, so
// io.Copy(file, resp.Body) lets the kernel splice socket to file.
type Response struct {
	Status     Status
	Meta       []byte
	PayloadLen uint64
	Body       io.Reader

	op   Op
	body *body
}

// NewClient returns a Client speaking over conn, which it owns from now on.
func NewClient(conn net.Conn) *Client {
	return &Client{conn: conn, br: bufio.NewReaderSize(conn, readBufSize)}
}

// DialClient dials rawURL (see ParseURL) and returns a Client on the
// connection. ctx bounds the dial only.
func DialClient(ctx context.Context, rawURL string, opts ...Option) (*Client, error) {
	conn, err := Dial(ctx, rawURL, opts...)
	if err != nil {
		return nil, err
	}
	return NewClient(conn), nil
}

// Close closes the connection. A pending response body fails afterwards.
func (c *Client) Close() error {
	if c.err == nil {
		c.err = fmt.Errorf("transport: client: %w", net.ErrClosed)
	}
	c.end()
	return c.conn.Close()
}

// Do sends req and reads the response header and meta, leaving the payload to
// Response.Body. The request payload is streamed, never held whole, and sent
// in full before the response is read, following the protocol's
// read-handle-reply order: a server that replies early and then stops
// reading (the C++ engine on a bad key) makes the send fail.
//
// A non-OK status is a successful Do: it is reported in Response.Status (see
// Response.Err). The context's deadline and cancellation apply to the whole
// exchange, including the reading of Body after Do returns; a deadline that
// strikes mid-exchange breaks the Client (the error wraps the context's
// error). Do refuses to start while the previous Body is unread
// (ErrUnreadBody) rather than silently draining a possibly huge payload.
func (c *Client) Do(ctx context.Context, req Request) (*Response, error) {
	if c.err != nil {
		return nil, c.err
	}
	if c.cur != nil {
		return nil, ErrUnreadBody
	}
	if req.Payload == nil && req.PayloadLen > 0 {
		return nil, fmt.Errorf("transport: %s: PayloadLen is %d but Payload is nil", req.Op, req.PayloadLen)
	}
	if req.PayloadLen > math.MaxInt64 {
		return nil, fmt.Errorf("transport: %s: PayloadLen %d is too large", req.Op, req.PayloadLen)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("transport: %s: %w", req.Op, err)
	}
	wb, err := appendRequest(c.wbuf[:0], req.Op, req.Key, req.Trace, req.PayloadLen)
	if err != nil {
		return nil, err
	}
	// A small payload rides in the header's write: one segment for control
	// ops, and a short Payload is caught before anything is sent.
	inline := req.PayloadLen > 0 && req.PayloadLen <= inlinePayload
	if inline {
		n := len(wb)
		wb = slices.Grow(wb, int(req.PayloadLen))[:n+int(req.PayloadLen)]
		if m, err := io.ReadFull(req.Payload, wb[n:]); err != nil {
			c.wbuf = wb[:0]
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil, fmt.Errorf("transport: %s: Payload ended after %d of PayloadLen %d bytes", req.Op, m, req.PayloadLen)
			}
			return nil, fmt.Errorf("transport: %s: read Payload: %w", req.Op, err)
		}
	}
	c.wbuf = wb
	// The server only speaks when spoken to; stray bytes mean the previous
	// exchange was misframed (e.g. the C++ engine's unframed STATE_GET
	// NOT_FOUND text), and the next header would be garbage.
	if n := c.br.Buffered(); n > 0 {
		return nil, c.broken(fmt.Errorf("transport: server sent %d unexpected bytes after the previous response", n))
	}

	c.begin(ctx)
	if _, err := c.conn.Write(wb); err != nil {
		return nil, c.fail(req.Op, "send request", err)
	}
	if req.PayloadLen > 0 && !inline {
		if err := c.sendPayload(req); err != nil {
			return nil, c.fail(req.Op, "send payload", err)
		}
	}

	if _, err := io.ReadFull(c.br, c.hdr[:]); err != nil {
		if err == io.EOF {
			err = errors.New("server closed the connection without a reply")
		}
		return nil, c.fail(req.Op, "read response header", noEOF(err))
	}
	h, _ := ParseResponseHeader(c.hdr[:])
	resp := &Response{Status: h.Status, PayloadLen: h.PayloadLen, op: req.Op}
	if h.MetaLen > 0 {
		resp.Meta = make([]byte, h.MetaLen)
		if _, err := io.ReadFull(c.br, resp.Meta); err != nil {
			return nil, c.fail(req.Op, "read response meta", noEOF(err))
		}
	}
	resp.body = &body{c: c, op: req.Op, rem: h.PayloadLen}
	resp.Body = resp.body
	if h.PayloadLen == 0 {
		c.end()
	}
	return resp, nil
}

// sendPayload copies exactly req.PayloadLen bytes from req.Payload.
func (c *Client) sendPayload(req Request) error {
	src := &io.LimitedReader{R: req.Payload, N: int64(req.PayloadLen)}
	var dst io.Writer = c.conn
	switch req.Payload.(type) {
	case *os.File, *net.TCPConn, *net.UnixConn:
		// The connection's ReadFrom moves these in the kernel (sendfile, splice).
	default:
		// Hide ReaderFrom: its generic path copies through 32 KiB pieces.
		dst = struct{ io.Writer }{c.conn}
	}
	n, err := io.CopyBuffer(dst, src, c.buffer(req.PayloadLen))
	if err != nil {
		return err
	}
	if uint64(n) < req.PayloadLen {
		return fmt.Errorf("payload ended after %d of PayloadLen %d bytes", n, req.PayloadLen)
	}
	return nil
}

// buffer returns the copy buffer, sized for n bytes but at most copyBufSize.
func (c *Client) buffer(n uint64) []byte {
	size := int(min(max(n, 4<<10), copyBufSize))
	if len(c.cbuf) < size {
		c.cbuf = make([]byte, size)
	}
	return c.cbuf
}

// begin starts a request: the context's deadline becomes the connection's,
// and cancellation interrupts blocked I/O by moving the deadline to the past.
func (c *Client) begin(ctx context.Context) {
	cl := &call{ctx: ctx}
	if d, ok := ctx.Deadline(); ok {
		c.conn.SetDeadline(d)
	}
	if ctx.Done() != nil {
		cl.stop = context.AfterFunc(ctx, func() {
			cl.mu.Lock()
			defer cl.mu.Unlock()
			if !cl.done {
				c.conn.SetDeadline(aLongTimeAgo)
			}
		})
	}
	c.cur = cl
}

// end finishes the request in progress, if any. The done flag, set under the
// lock, keeps a cancellation racing with the end from poisoning the deadline
// of the next request.
func (c *Client) end() {
	cl := c.cur
	if cl == nil {
		return
	}
	c.cur = nil
	if cl.stop != nil {
		cl.stop()
	}
	cl.mu.Lock()
	cl.done = true
	cl.mu.Unlock()
	if c.err == nil {
		c.conn.SetDeadline(time.Time{})
	}
}

// fail records an I/O failure during op, which desynchronises the stream,
// and returns the error to report. A deadline error caused by the context is
// reported as the context's error.
func (c *Client) fail(op Op, what string, err error) error {
	if cl := c.cur; cl != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := cl.ctx.Err(); cerr != nil {
			err = cerr
		} else if d, ok := cl.ctx.Deadline(); ok && !time.Now().Before(d) {
			err = context.DeadlineExceeded
		}
	}
	return c.broken(fmt.Errorf("transport: %s: %s: %w", op, what, err))
}

// broken marks the Client unusable, closes the connection and returns err.
func (c *Client) broken(err error) error {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %w", ErrClientBroken, err)
		c.conn.Close()
	}
	c.end()
	return err
}

// Close drains any unread Body so the connection stays in sync for the next
// request. It is a no-op once Body has been read to the end.
func (r *Response) Close() error {
	if r.body == nil {
		return nil
	}
	return r.body.drain()
}

// Err returns nil for StatusOK and a *ReplyError otherwise.
func (r *Response) Err() error {
	if r.Status == StatusOK {
		return nil
	}
	return &ReplyError{Op: r.op, Status: r.Status, Meta: r.Meta}
}

// readAll reads the whole Body. Memory grows with the bytes received, so a
// bogus payload_len cannot make it allocate what the server never sends.
func (r *Response) readAll() ([]byte, error) {
	n := r.PayloadLen
	if n > math.MaxInt {
		return nil, fmt.Errorf("transport: %s: payload of %d bytes does not fit in memory", r.op, n)
	}
	b := make([]byte, 0, min(n, callInitialBuf))
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, int(min(n-uint64(len(b)), uint64(cap(b)))))
		}
		m, err := r.body.Read(b[len(b):cap(b)])
		b = b[:len(b)+m]
		if err != nil && err != io.EOF {
			return nil, err
		}
	}
	return b, nil
}

// Call sends op with key and an in-memory payload, and returns the response
// together with its whole payload. Use Do to stream large payloads. As with
// Do, a non-OK status is not an error.
func (c *Client) Call(ctx context.Context, op Op, key string, payload []byte) (*Response, []byte, error) {
	resp, err := c.Do(ctx, Request{Op: op, Key: key, Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		return nil, nil, err
	}
	b, err := resp.readAll()
	if err != nil {
		return nil, nil, err
	}
	return resp, b, nil
}

// ReplyError is a non-OK response status with the reply's meta.
type ReplyError struct {
	Op     Op
	Status Status
	Meta   []byte
}

func (e *ReplyError) Error() string {
	msg := e.Message()
	if msg == "" {
		return fmt.Sprintf("transport: %s: server replied %s", e.Op, e.Status)
	}
	return fmt.Sprintf("transport: %s: server replied %s: %s", e.Op, e.Status, msg)
}

// Message returns the meta's "error" field, or the meta itself when it is not
// a JSON object carrying one.
func (e *ReplyError) Message() string {
	var m struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(e.Meta, &m) == nil && m.Error != "" {
		return m.Error
	}
	return string(bytes.TrimSpace(e.Meta))
}

// body is a Response payload: a view of the connection limited to rem bytes.
type body struct {
	c   *Client
	op  Op
	rem uint64
	err error // sticky read failure
}

func (b *body) Read(p []byte) (int, error) {
	if b.rem == 0 {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if uint64(len(p)) > b.rem {
		p = p[:b.rem]
	}
	n, err := b.c.br.Read(p)
	b.advance(n)
	if b.rem > 0 && err != nil {
		b.err = b.c.fail(b.op, "read response payload", noEOF(err))
		return n, b.err
	}
	return n, nil
}

// WriteTo writes the rest of the payload to w. Bytes already buffered go
// first; the remainder is copied from the connection itself so that a w with
// ReaderFrom (an *os.File, a socket) can splice it in the kernel.
func (b *body) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if b.rem > 0 && b.err == nil && b.c.br.Buffered() > 0 {
		p, _ := b.c.br.Peek(int(min(uint64(b.c.br.Buffered()), b.rem)))
		n, err := w.Write(p)
		b.c.br.Discard(n)
		b.advance(n)
		total += int64(n)
		if err != nil {
			return total, err // nothing was lost: Close can still drain
		}
	}
	switch w.(type) {
	case *os.File, *net.TCPConn, *net.UnixConn:
		// Their ReadFrom splices from the socket in the kernel.
	default:
		// Hide any other ReaderFrom (io.Discard's reads 8 KiB at a time) so
		// the copy goes through the 1 MiB buffer.
		w = struct{ io.Writer }{w}
	}
	for b.rem > 0 {
		if b.err != nil {
			return total, b.err
		}
		want := min(b.rem, math.MaxInt64)
		src := &io.LimitedReader{R: b.c.conn, N: int64(want)}
		n, err := io.CopyBuffer(w, src, b.c.buffer(want))
		b.advance(int(n))
		total += n
		if err != nil || uint64(n) < want {
			// Bytes read but not written are lost either way, so any failure
			// here desynchronises the stream.
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			b.err = b.c.fail(b.op, "copy response payload", err)
			return total, b.err
		}
	}
	return total, nil
}

// advance accounts for n payload bytes consumed and ends the request when the
// payload is done.
func (b *body) advance(n int) {
	b.rem -= uint64(n)
	if b.rem == 0 && n > 0 {
		b.c.end()
	}
}

// drain discards the rest of the payload.
func (b *body) drain() error {
	for b.rem > 0 {
		if b.err != nil {
			return b.err
		}
		if _, err := b.Read(b.c.buffer(b.rem)); err != nil && err != io.EOF {
			return err
		}
	}
	return nil
}
