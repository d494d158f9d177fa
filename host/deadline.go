package host

import (
	"bufio"
	"io"
	"net"
	"syscall"
	"time"
)

// deadlineConn arms a fresh deadline before every Read and Write, so a peer
// that stalls for longer than the timeout inside a payload is cut off while a
// transfer that keeps moving is never capped in total (protocol §11.13).
type deadlineConn struct {
	net.Conn
	readTimeout  time.Duration
	writeTimeout time.Duration
}

func (c *deadlineConn) Read(p []byte) (int, error) {
	if err := c.armRead(); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *deadlineConn) armRead() error {
	if c.readTimeout > 0 {
		return c.Conn.SetReadDeadline(time.Now().Add(c.readTimeout))
	}
	return nil
}

// rawSocket is the connection's socket when the kernel can splice from it
// (TCP, Unix; not TLS, whose bytes need decrypting).
func (c *deadlineConn) rawSocket() (syscall.RawConn, bool) {
	switch conn := c.Conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		raw, err := conn.(syscall.Conn).SyscallConn()
		return raw, err == nil
	}
	return nil, false
}

func (c *deadlineConn) Write(p []byte) (int, error) {
	if c.writeTimeout > 0 {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout)); err != nil {
			return 0, err
		}
	}
	return c.Conn.Write(p)
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
