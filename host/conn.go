package host

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

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
