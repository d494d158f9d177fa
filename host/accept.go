package host

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/transport"
)

// A failing Accept (out of file descriptors, a connection aborted before it
// was taken) is retried after a pause, as net/http does: 5 ms, doubling up to
// 1 s, back to 5 ms after a success. Only a closed listener ends Serve, so no
// client can stop the engine by using up its descriptors.
const (
	acceptDelayMin = 5 * time.Millisecond
	acceptDelayMax = time.Second
	// acceptLogEvery is the least time between two log lines about failing
	// accepts: a sustained failure retries every second, and a flood of
	// connections can make accept fail and succeed in turn.
	acceptLogEvery = 10 * time.Second
)

// acceptRetry paces one listener's accept loop through failures.
type acceptRetry struct {
	log     hclog.Logger
	delay   time.Duration // the last pause; 0 after a success
	unseen  int           // failures not yet reported in a log line
	total   uint64        // failures since the listener opened
	logged  time.Time     // when the last line was written
	nowFunc func() time.Time
}

func (r *acceptRetry) now() time.Time {
	if r.nowFunc != nil {
		return r.nowFunc()
	}
	return time.Now()
}

// failed counts err and returns how long to wait before the next Accept. It
// logs at most one line per acceptLogEvery, with the failures since the last.
func (r *acceptRetry) failed(err error) time.Duration {
	r.delay = min(max(2*r.delay, acceptDelayMin), acceptDelayMax)
	r.unseen++
	r.total++
	if now := r.now(); r.logged.IsZero() || now.Sub(r.logged) >= acceptLogEvery {
		r.log.Error("accepting a connection failed; retrying with backoff (logged at most every "+acceptLogEvery.String()+")",
			"error", err, "failures", r.unseen, "failures_total", r.total, "retry_in", r.delay)
		r.unseen, r.logged = 0, now
	}
	return r.delay
}

// succeeded starts the pause over after a success.
func (r *acceptRetry) succeeded() { r.delay = 0 }

// Connections beyond a listener's limit are refused with a reply: BUSY and
// the reason, after the client's first request header or refuseWait,
// whichever comes first. At most maxRefusing per listener are answered at
// once (each holds a descriptor for up to 2 × refuseWait); past that a
// connection is closed at once, so a flood cannot use descriptors up through
// the refusals either.
const (
	refuseWait  = time.Second
	maxRefusing = 64
	// refuseDrain bounds what a refused connection reads after the reply.
	refuseDrain = 64 << 10
)

// connLimit counts one listener's connections against its limit and its
// refusals in progress against maxRefusing; only the listener's accept loop
// calls take and refuse.
type connLimit struct {
	max      int
	open     chan struct{}
	refusing chan struct{}
	reply    []byte // the framed BUSY reply
	unseen   int    // refusals not yet reported in a log line
	logged   time.Time
}

func newConnLimit(max int) *connLimit {
	meta := transport.ErrorMeta(fmt.Sprintf("too many connections: the limit is %d per listener", max))
	h := transport.AppendResponseHeader(nil, transport.ResponseHeader{Status: transport.StatusBusy, MetaLen: uint32(len(meta))})
	return &connLimit{
		max: max, open: make(chan struct{}, max), refusing: make(chan struct{}, maxRefusing),
		reply: append(h, meta...),
	}
}

// take admits one more connection if the limit allows; release gives it back.
func (l *connLimit) take() bool {
	select {
	case l.open <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *connLimit) release() { <-l.open }

// refuse answers c in a goroutine of its own, or closes it at once when
// maxRefusing refusals are in progress already. It warns at most once per
// acceptLogEvery, with the refusals since the last line.
func (l *connLimit) refuse(c net.Conn, log hclog.Logger) {
	l.unseen++
	if now := time.Now(); l.logged.IsZero() || now.Sub(l.logged) >= acceptLogEvery {
		log.Warn("connection limit reached: refusing connections with BUSY (logged at most every "+acceptLogEvery.String()+")",
			"max_conns", l.max, "refused", l.unseen)
		l.unseen, l.logged = 0, now
	}
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	go func() {
		defer func() { <-l.refusing }()
		refuseConn(c, l.reply)
	}()
}

// refuseConn reads the client's first request header (or waits refuseWait
// for it), writes reply, shuts its side of c and reads what else the client
// sends for up to refuseWait more, so that closing does not reset the
// connection before the client has read the reply; then it closes c.
func refuseConn(c net.Conn, reply []byte) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(refuseWait))
	var hb [transport.RequestHeaderSize]byte
	if _, err := io.ReadFull(c, hb[:]); err != nil && !isTimeout(err) {
		return // the client left (or a TLS handshake failed)
	}
	c.SetDeadline(time.Now().Add(refuseWait))
	if _, err := c.Write(reply); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	io.Copy(io.Discard, io.LimitReader(c, refuseDrain))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
