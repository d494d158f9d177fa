package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// request is one parsed request; Payload yields exactly hdr.PayloadLen bytes.
type request struct {
	hdr     transport.RequestHeader
	key     string
	trace   string
	ctx     context.Context // the server's, with the request's span
	payload *io.LimitedReader
	conn    *deadlineConn // the socket under payload, nil in tests
	release func()        // gives back the payload budget readPayload took
	export  *exportFile   // the connection's STATE_EXPORT file, removed when it closes
}

// readPayload reads the whole payload, which dispatch has bounded, once the
// payload budget admitted it. A refusal (the budget stayed short, or the
// payload exceeds it) is replied and returned with ok false; err is then
// the reply's error.
func (s *Server) readPayload(req *request, rp *replier) (payload []byte, ok bool, err error) {
	release, err := s.AdmitPayload(s.ctx, uint64(req.payload.N))
	switch {
	case errors.Is(err, ErrBudgetBusy):
		return nil, false, rp.fail(transport.StatusBusy, fmt.Sprintf("%v: %v", req.hdr.Op, err))
	case err != nil:
		return nil, false, rp.fail(transport.StatusError, fmt.Sprintf("%v payload of %d bytes: %v", req.hdr.Op, req.payload.N, err))
	}
	req.release = release
	b := make([]byte, req.payload.N)
	if _, err := io.ReadFull(req.payload, b); err != nil {
		return nil, false, errFatal{err}
	}
	return b, true, nil
}

// errFatal marks a failure after which the connection cannot stay in sync:
// the reply was already started, or the peer is gone.
type errFatal struct{ err error }

func (e errFatal) Error() string { return e.err.Error() }
func (e errFatal) Unwrap() error { return e.err }

// replier writes one response. Every reply is fully framed.
type replier struct {
	w          *bufio.Writer
	sent       bool
	status     transport.Status
	payloadLen uint64
	network    string // the client's socket ("tcp", "unix"), for logs
}

// header writes the response header and meta; payloadLen bytes must follow.
func (r *replier) header(st transport.Status, meta []byte, payloadLen uint64) error {
	if r.sent {
		return errFatal{errors.New("host: second reply to one request")}
	}
	r.sent, r.status, r.payloadLen = true, st, payloadLen
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

// replyMeta replies with m, or with ERROR naming the value m could not
// encode: a reply the engine cannot write fails its request, it never stops
// the engine.
func (r *replier) replyMeta(st transport.Status, m *transport.Meta, payload []byte) error {
	if err := m.Err(); err != nil {
		return r.fail(transport.StatusError, "the reply could not be encoded: "+err.Error())
	}
	return r.reply(st, m.Bytes(), payload)
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

// maxDrain is the most of a refused request's payload the connection reads
// and throws away to stay usable: twice the largest JSON payload, so every
// refused control request and a malformed state of a few MiB keep their
// connection as they always did. Beyond it (a payload announced past every
// limit) the connection is closed once the reply is out, so the refusal
// costs neither side the transfer; a client that sends the whole payload
// before reading finds its send failing and the reply waiting. BUSY
// refusals are drained whatever their size: the request was valid, and its
// client may retry on the same connection.
const maxDrain = 2 * DefaultMaxJSONBytes

func (s *Server) serveConn(raw net.Conn) {
	defer raw.Close()
	log := s.log.With("remote", raw.RemoteAddr().String())
	if err := SetSocketBuffers(raw, s.cfg.SocketBuffer); err != nil {
		log.Warn("setting the socket buffers", "error", err)
	}
	dc := newDeadlineConn(raw, s.minRate())
	br := bufio.NewReaderSize(dc, 64<<10)
	bw := bufio.NewWriterSize(dc, 64<<10)
	peer := s.peerAttrs(raw)
	export := &exportFile{}
	defer export.remove()
	for {
		req, ok := s.nextRequest(dc, br, log)
		if !ok {
			return
		}
		req.export = export
		if !s.serveRequest(req, bw, log, peer) {
			return
		}
	}
}

// minRate is the configured minimum transfer rate (0: the default).
func (s *Server) minRate() MinRate {
	rate := s.cfg.MinTransferRate
	if rate == 0 {
		rate = DefaultMinTransferRate
	}
	return NewMinRate(rate, RateWindow(s.cfg.ChunkTimeout))
}

// nextRequest waits under the idle timeout for the next request and reads
// its header, key and trace; the request's deadlines start with its first
// byte. false: the connection is to be closed.
func (s *Server) nextRequest(dc *deadlineConn, br *bufio.Reader, log hclog.Logger) (*request, bool) {
	dc.endRequest()
	if err := dc.Conn.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout)); err != nil || s.isStopping() {
		return nil, false
	}
	if _, err := br.Peek(1); err != nil {
		if !errors.Is(err, io.EOF) && !s.isStopping() {
			log.Debug("connection closed while waiting for a request", "error", err)
		}
		return nil, false
	}
	dc.beginRequest(s.cfg.ChunkTimeout)
	var hb [transport.RequestHeaderSize]byte
	if _, err := io.ReadFull(br, hb[:]); err != nil {
		log.Debug("connection closed inside a request header", "error", err)
		return nil, false
	}
	hdr, err := transport.ParseRequestHeader(hb[:])
	if err != nil {
		log.Warn("closing connection", "error", err, "bytes", fmt.Sprintf("% x", hb[:4]))
		return nil, false
	}
	kt := make([]byte, int(hdr.KeyLen)+int(hdr.TraceLen))
	if _, err := io.ReadFull(br, kt); err != nil {
		log.Debug("connection closed inside a request", "error", err)
		return nil, false
	}
	if hdr.PayloadLen > 1<<62 {
		log.Warn("closing connection: payload length beyond any limit", "op", hdr.Op, "payload_len", hdr.PayloadLen)
		return nil, false
	}
	req := &request{
		hdr: hdr, key: string(kt[:hdr.KeyLen]), trace: string(kt[hdr.KeyLen:]),
		payload: &io.LimitedReader{R: payloadReader{br, dc}, N: int64(hdr.PayloadLen)},
		conn:    dc,
	}
	dc.payload = req.payload
	return req, true
}

// serveRequest dispatches req, flushes its reply and disposes of what the
// handler left of the payload, in a span of its own (peer: the connection's
// attributes). false: the connection is to be closed.
func (s *Server) serveRequest(req *request, bw *bufio.Writer, log hclog.Logger, peer []attribute.KeyValue) bool {
	op := req.hdr.Op
	rp := &replier{w: bw, network: req.conn.LocalAddr().Network()}
	start := time.Now()
	sp := s.startSpan(req, peer)
	var err error
	defer func() { endSpan(sp, rp, err) }()
	log = tracing.Logger(req.ctx, log)
	err = s.dispatch(req, rp)
	if req.release != nil {
		req.release()
	}
	if err == nil && !rp.sent {
		err = errFatal{fmt.Errorf("host: %v sent no reply", op)}
	}
	s.stats.request(op, rp.status, err != nil, time.Since(start))
	if err != nil {
		log.Warn("request aborted, closing connection", "op", op, "key", req.key, "trace", req.trace, "error", err)
		return false
	}
	// The reply goes out first, so a client refused early learns it
	// before sending the rest.
	if err = bw.Flush(); err != nil {
		log.Debug("connection closed while replying", "op", op, "error", err)
		return false
	}
	if !s.drain(req, rp.status, log) {
		return false
	}
	log.Trace("request served", "op", op, "key", req.key, "trace", req.trace, "elapsed", time.Since(start))
	return true
}

// drain reads and discards whatever the handler left of the payload, so a
// refused or unknown request never desyncs the connection; false when the
// rest is beyond maxDrain (and the reply not BUSY) or the client went away.
func (s *Server) drain(req *request, st transport.Status, log hclog.Logger) bool {
	if req.payload.N == 0 {
		return true
	}
	if req.payload.N > maxDrain && st != transport.StatusBusy {
		log.Debug("closing connection instead of draining a refused payload", "op", req.hdr.Op, "status", st, "unread", req.payload.N)
		return false
	}
	if _, err := io.Copy(io.Discard, req.payload); err != nil {
		log.Debug("connection closed while draining a payload", "op", req.hdr.Op, "error", err)
		return false
	}
	return true
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
	case transport.OpStateExport:
		return s.handleStateExport(req, rp)
	case transport.OpStateImport:
		return s.handleStateImport(req, rp)
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
