package host

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"syscall"
	"time"
)

// MaxRateWindow is the longest window over which a minimum transfer rate is
// checked; RateWindow shortens it to the per-read stall limit.
const MaxRateWindow = 10 * time.Second

// RateWindow is the window for a minimum transfer rate under a per-read
// stall limit of chunkTimeout: a window longer than the stall limit would
// let a trickle hold a transfer longer than a complete stall may.
func RateWindow(chunkTimeout time.Duration) time.Duration {
	if chunkTimeout > 0 {
		return min(MaxRateWindow, chunkTimeout)
	}
	return MaxRateWindow
}

// MinRate enforces a minimum transfer rate on one side of a transfer: in
// every window of time spent waiting on the socket at least rate × window
// bytes must move, else the next socket operation's deadline is already
// past. Only time inside socket operations counts, so time the host spends
// on the backend or waiting for the payload budget is never charged to the
// peer, and a transfer that keeps the rate is never capped in total. A
// request whose remaining bytes are fewer than a window's due must finish
// within the window, which is the same rule. Not safe for concurrent use.
type MinRate struct {
	need   int64 // bytes due per window; 0: off
	window time.Duration
	moved  int64         // bytes moved in this window
	spent  time.Duration // socket time spent in this window
}

// NewMinRate returns a rate of at least rate bytes per second over windows
// of window; rate <= 0 turns it off.
func NewMinRate(rate int64, window time.Duration) MinRate {
	if rate <= 0 || window <= 0 {
		return MinRate{}
	}
	need := float64(rate) * window.Seconds()
	return MinRate{need: int64(min(max(need, 1), math.MaxInt64/2)), window: window}
}

// Due is how many bytes must move per window; 0 when the rate is off.
func (m *MinRate) Due() int64 { return m.need }

// Reset starts a fresh window, as at the start of a request.
func (m *MinRate) Reset() { m.moved, m.spent = 0, 0 }

// Deadline is the latest a socket operation starting at now may end: the
// end of the current window, or of a fresh one when this window's bytes
// have moved. The zero time when the rate is off.
func (m *MinRate) Deadline(now time.Time) time.Time {
	if m.need == 0 {
		return time.Time{}
	}
	if m.moved >= m.need {
		m.Reset()
	}
	return now.Add(m.window - m.spent)
}

// Done records a socket operation that moved n bytes in d.
func (m *MinRate) Done(n int64, d time.Duration) {
	m.moved += n
	m.spent += d
}

// Exceeded reports whether the window ran out with an operation pending.
func (m *MinRate) Exceeded() bool {
	return m.need > 0 && m.spent >= m.window
}

// Err is the error of an operation that timed out because the rate was not
// kept; it matches os.ErrDeadlineExceeded. Other errors pass through.
func (m *MinRate) Err(err error) error {
	if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || !m.Exceeded() {
		return err
	}
	return &RateError{Moved: m.moved, Due: m.need, Window: m.window}
}

// RateError is a transfer cut for moving less than its minimum rate.
type RateError struct {
	Moved, Due int64
	Window     time.Duration
}

func (e *RateError) Error() string {
	return fmt.Sprintf("transfer below the minimum rate of %d bytes per %v of socket time (%d moved in the last window, then stalled)", e.Due, e.Window, e.Moved)
}

// Timeout makes a RateError a net.Error timeout, as the deadline it is.
func (e *RateError) Timeout() bool   { return true }
func (e *RateError) Temporary() bool { return false }
func (e *RateError) Is(target error) bool {
	return target == os.ErrDeadlineExceeded
}

// deadlineConn arms a deadline before every Read and Write inside a
// request: the per-operation stall limit (a peer that stalls for longer than
// the timeout is cut off, protocol §11.13) and the end of the minimum
// transfer rate's window, whichever comes first. Between requests it arms
// nothing: the idle timeout set on the socket applies.
type deadlineConn struct {
	net.Conn
	readTimeout  time.Duration
	writeTimeout time.Duration
	rate         MinRate
	inRequest    bool
	// payload is the request's payload, whose remaining count tells how
	// many bytes a raw read (rawSocket) took off the socket; rawN is that
	// count when the last raw read started, -1 when it has been counted.
	payload *io.LimitedReader
	rawN    int64
}

func newDeadlineConn(c net.Conn, rate MinRate) *deadlineConn {
	return &deadlineConn{Conn: c, rate: rate, rawN: -1}
}

// beginRequest starts the per-request deadlines and a fresh rate window.
func (c *deadlineConn) beginRequest(chunkTimeout time.Duration) {
	c.readTimeout, c.writeTimeout = chunkTimeout, chunkTimeout
	c.inRequest = true
	c.rate.Reset()
}

// endRequest leaves the socket to the idle timeout.
func (c *deadlineConn) endRequest() {
	c.settleRaw()
	c.readTimeout, c.inRequest, c.payload = 0, false, nil
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	now := time.Now()
	if err := c.armReadAt(now); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	return n, c.done(n, now, err)
}

// armRead arms the read deadline for a read starting now.
func (c *deadlineConn) armRead() error { return c.armReadAt(time.Now()) }

func (c *deadlineConn) armReadAt(now time.Time) error {
	if d, ok := c.deadline(now, c.readTimeout); ok {
		return c.Conn.SetReadDeadline(d)
	}
	return nil
}

// Write writes p in pieces of at most a quarter of a window's due bytes
// inside a request, each under its own deadline: one large write (a state
// chunk) to a client reading at the minimum rate would otherwise outlast
// the window it started in.
func (c *deadlineConn) Write(p []byte) (int, error) {
	piece := len(p)
	if c.inRequest && c.rate.need > 0 {
		piece = int(max(min(c.rate.need/4, int64(len(p))), 1))
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

func (c *deadlineConn) writePiece(p []byte) (int, error) {
	now := time.Now()
	if d, ok := c.deadline(now, c.writeTimeout); ok {
		if err := c.Conn.SetWriteDeadline(d); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Write(p)
	return n, c.done(n, now, err)
}

// deadline is the deadline for an operation starting at now under the stall
// limit timeout and, inside a request, the rate's window; false: none.
func (c *deadlineConn) deadline(now time.Time, timeout time.Duration) (time.Time, bool) {
	var d time.Time
	if timeout > 0 {
		d = now.Add(timeout)
	}
	if c.inRequest {
		c.settleRaw()
		if r := c.rate.Deadline(now); !r.IsZero() && (d.IsZero() || r.Before(d)) {
			d = r
		}
	}
	return d, !d.IsZero()
}

// done counts an operation that started at start and moved n bytes, and
// names a rate cut as such.
func (c *deadlineConn) done(n int, start time.Time, err error) error {
	if !c.inRequest {
		return err
	}
	c.rate.Done(int64(n), time.Since(start))
	return c.rate.Err(err)
}

// settleRaw counts the bytes the last raw read took off the socket, which
// its caller subtracted from the payload's remaining count.
func (c *deadlineConn) settleRaw() {
	if c.rawN >= 0 && c.payload != nil {
		c.rate.Done(c.rawN-c.payload.N, 0)
	}
	c.rawN = -1
}

// rawSocket is the connection's socket when the kernel can splice from it
// (TCP, Unix; not TLS, whose bytes need decrypting). Its reads count
// against the minimum rate like the connection's own.
func (c *deadlineConn) rawSocket() (syscall.RawConn, bool) {
	switch conn := c.Conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		raw, err := conn.(syscall.Conn).SyscallConn()
		if err != nil {
			return nil, false
		}
		return ratedRawConn{RawConn: raw, c: c}, true
	}
	return nil, false
}

// ratedRawConn times the raw reads of a deadlineConn's socket; the bytes
// they move are counted from the payload afterwards (settleRaw).
type ratedRawConn struct {
	syscall.RawConn
	c *deadlineConn
}

func (r ratedRawConn) Read(f func(fd uintptr) bool) error {
	r.c.settleRaw()
	if r.c.payload != nil {
		r.c.rawN = r.c.payload.N
	}
	// Armed again from the instant the read is timed from, so that a read
	// cut by the rate's deadline has spent the whole window (RateError),
	// however late it started after the caller armed it.
	start := time.Now()
	if err := r.c.armReadAt(start); err != nil {
		return err
	}
	err := r.RawConn.Read(f)
	return r.c.done(0, start, err)
}

// countingWriter counts the bytes that pass through it.
type countingWriter struct {
	w interface{ Write([]byte) (int, error) }
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// payloadReader reads a request payload. bufio.Reader reads into its own
// buffer whenever the caller asks for less than that buffer, so the tail of
// every large read (a ring chunk of a STATE_PUT) would be read into it and
// copied again, and the next chunk would start with a copy as well. Reads of
// at least directRead bytes therefore go straight to the connection once the
// buffered bytes are used up; small reads (headers, fields) stay buffered.
type payloadReader struct {
	br   *bufio.Reader
	conn io.Reader
}

const directRead = 4 << 10

func (r payloadReader) Read(p []byte) (int, error) {
	if len(p) < directRead || r.br.Buffered() > 0 {
		return r.br.Read(p)
	}
	return r.conn.Read(p)
}
