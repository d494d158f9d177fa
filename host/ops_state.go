package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// slotKey parses a slot op's key, replying ERROR when it is not a number.
func slotKey(req *request, rp *replier) (int, bool, error) {
	slot, err := parseSlotKey(req.key)
	if err != nil {
		return 0, false, rp.fail(transport.StatusError, fmt.Sprintf("invalid slot key %q", req.key))
	}
	return slot, true, nil
}

// handleStateGet streams the slot's v2 blob: header, then the backend's state
// written straight into the socket in state_chunk_size pieces.
func (s *Server) handleStateGet(req *request, rp *replier) error {
	bs, ok, err := s.openBlobSlot(req, rp, false)
	if !ok {
		return err
	}
	defer bs.lease.release(nil)
	si := bs.si
	return s.streamBlob(req.ctx, rp, bs.b, si, transport.NewMeta().Add("n_past", si.NPast).Add("state_size", si.StateSize).AddFields(bs.info.Model),
		bs.x, nil, func() { bs.lease.release(nil) })
}

// blobSlot is a slot marked transferring whose state goes out as a v2
// blob: its lease, backend, the backend's info, the slot and the blob's
// extras.
type blobSlot struct {
	lease *slotLease
	b     iface.Backend
	info  iface.BackendInfo
	si    iface.SlotInfo
	x     transport.BlobExtras
}

// openBlobSlot reads a request for a slot's blob (STATE_GET, STATE_EXPORT:
// the slot key, then nothing or JSON blob options, where strict nothing
// else), marks the slot transferring and gathers what its blob needs, the
// slot's newest context checkpoint included. ok false: the request was
// answered (err is the reply's) and the slot is free.
func (s *Server) openBlobSlot(req *request, rp *replier, strict bool) (bs blobSlot, ok bool, err error) {
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return bs, false, err
	}
	var opts blobOptions
	if req.payload.N > 0 {
		// The extras' options (blob_layout, blob_trailer); STATE_GET
		// ignores any other payload, as it always did.
		p, ok, err := s.readPayload(req, rp)
		if !ok {
			return bs, false, err
		}
		parse := parseBlobOptions
		if strict {
			parse = parseBlobOptionsStrict
		}
		if opts, err = parse(p); err != nil {
			return bs, false, rp.fail(transport.StatusError, err.Error())
		}
	}
	if bs.lease, err = s.slots.acquire(slot, slotTransferring); err != nil {
		return bs, false, rp.failErr(err)
	}
	fail := func(reply error) (blobSlot, bool, error) {
		bs.lease.release(nil)
		return bs, false, reply
	}
	if bs.b, bs.info, err = s.backendFor(bs.lease); err != nil {
		return fail(rp.failErr(err))
	}
	if bs.x, err = s.blobExtras(opts, bs.info); err != nil {
		return fail(rp.fail(transport.StatusError, err.Error()))
	}
	if bs.si, err = bs.b.Slot(req.ctx, slot); err != nil {
		return fail(rp.failErr(err))
	}
	s.withCheckpoint(req.ctx, bs.b, slot, opts, &bs.x)
	return bs, true, nil
}

// blobHeader is the v2 header of si's blob with the extras x, and the
// blob's whole size with extra bytes after the state (PREFILL's logits).
func blobHeader(si iface.SlotInfo, x transport.BlobExtras, extra int64) (hdr []byte, total int64) {
	hdr = transport.AppendBlobHeader(make([]byte, 0, transport.BlobHeaderSize(len(si.Tokens), x)), si.NPast, si.Tokens, x)
	total = int64(len(hdr)) + si.StateSize + extra
	if x.Trailer {
		total += transport.TrailerSize
	}
	return hdr, total
}

// streamBlob replies OK with meta and the v2 blob of si with the extras x,
// the state followed by logits (PREFILL's) and, with x.Trailer, the
// integrity trailer: the CRC-32C of every payload byte before it, summed as
// the bytes go out (no byte is held for it). The reply starts with the backend's first state byte,
// so a backend that fails before producing any gets a proper error reply.
// The state's last byte is held back until the backend has finished and
// release has freed the slot, so a client that has the whole payload never
// finds the slot still busy. A failure after the reply started closes the
// connection: the client sees EOF before the announced payload length.
func (s *Server) streamBlob(ctx context.Context, rp *replier, b iface.Backend, si iface.SlotInfo, m *transport.Meta, x transport.BlobExtras, logits []byte, release func()) error {
	if err := m.Err(); err != nil {
		release()
		return rp.fail(transport.StatusError, "the reply could not be encoded: "+err.Error())
	}
	hdr, total := blobHeader(si, x, int64(len(logits)))
	start := time.Now()
	cw := newBlobWriter(rp.w, x.Trailer)
	lr := &lazyReply{rp: rp, meta: m.Bytes(), payloadLen: uint64(total), first: hdr, w: cw}
	hl := &holdLast{w: lr, remain: si.StateSize}
	var trace shm.TransferTrace
	_, err := b.StateGet(shm.WithTransferTrace(ctx, &trace), si.Slot, s.tun.StateChunkSize(), hl)
	if err != nil && !lr.started {
		s.transferDone(ctx, rp, false, si.Slot, 0, start, trace, err)
		return rp.failErr(err)
	}
	if err == nil && hl.remain != 0 {
		err = fmt.Errorf("backend wrote %d state bytes, announced %d", si.StateSize-hl.remain, si.StateSize)
	}
	if err == nil {
		err = lr.start()
	}
	if err == nil {
		release()
		if hl.held {
			_, err = cw.Write([]byte{hl.last})
		}
	}
	if err == nil {
		_, err = cw.Write(logits)
	}
	if err == nil {
		err = cw.writeTrailer()
	}
	if err == nil {
		err = rp.w.Flush()
	}
	s.transferDone(ctx, rp, false, si.Slot, cw.n, start, trace, err)
	if err != nil {
		return errFatal{fmt.Errorf("streaming slot %d state: %w", si.Slot, err)}
	}
	return nil
}

// lazyReply writes the OK reply's header and first bytes just before the
// first Write passes through (or at start).
type lazyReply struct {
	rp         *replier
	meta       []byte
	payloadLen uint64
	first      []byte
	w          io.Writer
	started    bool
}

func (l *lazyReply) start() error {
	if l.started {
		return nil
	}
	l.started = true
	if err := l.rp.header(transport.StatusOK, l.meta, l.payloadLen); err != nil {
		return err
	}
	_, err := l.w.Write(l.first)
	return err
}

func (l *lazyReply) Write(p []byte) (int, error) {
	if err := l.start(); err != nil {
		return 0, err
	}
	return l.w.Write(p)
}

// holdLast passes writes through but for the very last byte of remain.
type holdLast struct {
	w      io.Writer
	remain int64
	last   byte
	held   bool
}

func (h *holdLast) Write(p []byte) (int, error) {
	if int64(len(p)) > h.remain {
		return 0, fmt.Errorf("backend wrote past the announced state size by %d bytes", int64(len(p))-h.remain)
	}
	if int64(len(p)) == h.remain && len(p) > 0 {
		h.last, h.held = p[len(p)-1], true
		if _, err := h.w.Write(p[:len(p)-1]); err != nil {
			return 0, err
		}
		h.remain = 0
		return len(p), nil
	}
	n, err := h.w.Write(p)
	h.remain -= int64(n)
	return n, err
}

// readTracker remembers the first error of the socket side of a STATE_PUT,
// to tell a vanished client (close the connection) from bad bytes (reply),
// and when the payload's last byte came in.
type readTracker struct {
	r    *io.LimitedReader
	err  error
	last time.Time // when r.N reached 0
}

func (t *readTracker) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && t.err == nil && (err != io.EOF || t.r.N > 0) {
		// io.EOF before the announced length is the peer hanging up.
		t.err = err
	}
	t.read(n)
	return n, err
}

func (t *readTracker) read(n int) {
	if n > 0 && t.r.N == 0 {
		t.last = time.Now()
	}
}

// sinceLast is how long ago the payload's last byte came in (0 if it has not).
func (t *readTracker) sinceLast() time.Duration {
	if t.last.IsZero() {
		return 0
	}
	return time.Since(t.last)
}

// socketTracker is a readTracker whose payload the data plane may splice
// straight from the socket (shm.SocketSource).
type socketTracker struct {
	*readTracker
	br   *bufio.Reader
	conn *deadlineConn
	raw  syscall.RawConn
}

var _ shm.SocketSource = (*socketTracker)(nil)

// spliceable returns src as an shm.SocketSource when the request's payload
// comes from a socket the kernel can splice from, else nil.
func spliceable(req *request, src *readTracker) *socketTracker {
	pr, ok := req.payload.R.(payloadReader)
	if !ok || req.conn == nil {
		return nil
	}
	raw, ok := req.conn.rawSocket()
	if !ok {
		return nil
	}
	return &socketTracker{readTracker: src, br: pr.br, conn: req.conn, raw: raw}
}

// Network says which kind of socket the payload is in: the shm plane relays
// TCP restores only.
func (s *socketTracker) Network() string {
	if _, ok := s.conn.Conn.(*net.UnixConn); ok {
		return "unix"
	}
	return "tcp"
}

func (s *socketTracker) Buffered() int { return int(min(int64(s.br.Buffered()), s.r.N)) }

func (s *socketTracker) ReadSocket(f func(fd uintptr) (int, bool, error)) error {
	if s.br.Buffered() > 0 {
		return errors.New("reading the socket under buffered payload bytes")
	}
	err := s.conn.armRead()
	if err == nil {
		var n int64
		n, err = shm.ReadRawConn(s.raw, f)
		s.r.N -= n
		s.read(int(n))
	}
	if err != nil && s.err == nil {
		s.err = err
	}
	return err
}

// handleStatePut restores a slot from a streamed v2 (or v1) blob. Any failure
// leaves the slot empty.
func (s *Server) handleStatePut(req *request, rp *replier) error {
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	if req.hdr.PayloadLen > s.cfg.MaxStateBytes {
		return rp.fail(transport.StatusError, fmt.Sprintf("state payload of %d bytes exceeds the %d-byte limit", req.hdr.PayloadLen, s.cfg.MaxStateBytes))
	}
	src := &readTracker{r: req.payload}
	var in io.Reader = src
	if sock := spliceable(req, src); sock != nil {
		in = sock
	}
	return s.putState(req, rp, slot, src, in, true, nil, nil)
}

// putState restores slot from in, the blob src counts (src.r.N bytes), as
// STATE_PUT does, and replies. peer says the blob is the request's own
// payload, whose breaking closes the connection; otherwise (a shared-memory
// file) a broken read fails the restore like bad bytes. done, if any, must
// pass before a restore counts (else it fails as one); extra adds fields to
// the OK reply.
func (s *Server) putState(req *request, rp *replier, slot int, src *readTracker, in io.Reader, peer bool, done func() error, extra func(*transport.Meta)) error {
	lease, err := s.slots.acquire(slot, slotTransferring)
	if err != nil {
		return rp.failErr(err)
	}
	var after *iface.SlotInfo
	defer func() { lease.release(after) }()
	b, info, err := s.backendFor(lease)
	if err != nil {
		return rp.failErr(err)
	}
	start, total := time.Now(), src.r.N
	var trace shm.TransferTrace
	consumed, source, ckpt, err := s.restore(shm.WithTransferTrace(req.ctx, &trace), b, info, slot, in, total)
	if err == nil && done != nil {
		err = done()
	}
	trace.AfterPayload = src.sinceLast()
	s.transferDone(req.ctx, rp, true, slot, total-src.r.N, start, trace, err)
	if err != nil {
		// Never leave a slot half-restored; the backend clears on failure, and
		// this covers a backend that died on the way.
		if cerr := b.ClearSlot(req.ctx, slot); cerr != nil {
			tracing.Logger(req.ctx, s.log).Error("clearing slot after a failed restore", "slot", slot, "error", cerr)
		}
		empty := iface.SlotInfo{Slot: slot}
		if si, serr := b.Slot(req.ctx, slot); serr == nil {
			empty = si
		}
		after = &empty
		if peer && src.err != nil {
			return errFatal{fmt.Errorf("client stream broke during STATE_PUT of slot %d: %w", slot, src.err)}
		}
		tracing.Logger(req.ctx, s.log).Warn(fmt.Sprintf("%v failed, slot cleared", req.hdr.Op), "slot", slot, "error", err)
		return rp.fail(transport.StatusError, err.Error())
	}
	si, err := b.Slot(req.ctx, slot)
	if err != nil {
		return rp.failErr(err)
	}
	after = &si
	lease.source = source
	m := source.addTo(transport.NewMeta().Add("restored", true).Add("bytes", consumed).Add("n_past", si.NPast).AddFields(info.Model))
	if ckpt != "" {
		m.Add("checkpoint", ckpt)
	}
	if extra != nil {
		extra(m)
	}
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// transferDone counts a state transfer that began at start, logs it at debug
// level with the share of its time the host waited on the backend
// (TransferTrace), and records its span.
func (s *Server) transferDone(ctx context.Context, rp *replier, put bool, slot int, bytes int64, start time.Time, trace shm.TransferTrace, err error) {
	end := time.Now()
	d := end.Sub(start)
	path := trace.Path
	if path == "" {
		path = shm.PathGRPC
	}
	s.stats.transfer(put, path, bytes, d, trace.BackendWait, err)
	log := tracing.Logger(ctx, s.log)
	rate := float64(bytes) / max(d.Seconds(), 1e-9)
	log.Info("state transfer", "direction", direction(put), "network", rp.network, "slot", slot, "bytes", bytes,
		"seconds", d.Seconds(), "gbps", rate/1e9, "path", path, "backend_wait_share", trace.BackendWait.Seconds()/max(d.Seconds(), 1e-9),
		"chunk", s.tun.StateChunkSize(), "after_payload_seconds", trace.AfterPayload.Seconds(), "error", err)
	if f := s.cfg.TransferFloor; f > 0 && err == nil && bytes >= FloorMinBytes && rate < float64(f) {
		log.Warn("state transfer below the floor", "direction", direction(put), "slot", slot, "bytes", bytes, "gbps", rate/1e9,
			"floor_gbps", float64(f)/1e9, "path", path, "why", slowWhy(trace.BackendWait, d))
	}
	tracing.Transfer{Put: put, Slot: slot, Bytes: bytes, Chunk: s.tun.StateChunkSize(), Path: path,
		BackendWait: trace.BackendWait, AfterPayload: trace.AfterPayload}.Record(ctx, start, end, err)
}

// FloorMinBytes is the least a state transfer must move for TransferFloor to
// judge it: below it, fixed costs rather than throughput set its time.
const FloorMinBytes = 64 << 20

// slowWhy says which side set a slow transfer's pace: the backend, when the
// host waited on it for most of the time, else the socket or the client.
func slowWhy(backendWait, d time.Duration) string {
	if share := backendWait.Seconds() / max(d.Seconds(), 1e-9); share >= 0.5 {
		return fmt.Sprintf("the backend set the pace (the host waited on it %.0f%% of the time)", 100*share)
	}
	return "the socket or the client set the pace (the backend kept up)"
}

// restore parses the wrapper and hands the rest of the payload to the backend.
// A wrapper claiming more tokens than a slot holds is refused before anything
// is allocated for them, one whose layout differs from the backend's before
// the backend sees a byte; in a KV cache the slots share, idle HTTP
// sequences make room for the state first (MakeRoom). With an integrity
// trailer the backend gets the state (and logits) without it, summed on the
// way by whichever path the data plane takes (shm.SumReader), and the
// trailer is checked once the backend is done. It returns the bytes the
// backend consumed and the source the blob names, if any.
func (s *Server) restore(ctx context.Context, b iface.Backend, info iface.BackendInfo, slot int, src io.Reader, total int64) (int64, *StateSource, string, error) {
	var releases []func()
	defer func() {
		for _, r := range releases {
			r()
		}
	}()
	// A checkpoint is held in memory until the backend has it: from the
	// payload budget, as any payload read into memory.
	admit := func(n int64) error {
		release, err := s.AdmitPayload(ctx, uint64(n))
		if err != nil {
			return fmt.Errorf("the blob's context checkpoint of %d bytes: %w", n, err)
		}
		releases = append(releases, release)
		return nil
	}
	bh, err := transport.ReadBlobHeaderAdmit(src, total, info.SlotCtx(), admit)
	if err != nil {
		if errors.Is(err, transport.ErrMalformedBlob) {
			return 0, nil, "", err
		}
		return 0, nil, "", fmt.Errorf("%w: %w", transport.ErrMalformedBlob, err)
	}
	var source *StateSource
	if bh.Layout != nil {
		if source, err = checkLayout(bh.Layout, info.StateLayout); err != nil {
			return 0, nil, "", err
		}
	}
	size := total - bh.Size
	in := src
	var sum *shm.SumReader
	if bh.HasTrailer {
		size -= transport.TrailerSize
		sum = &shm.SumReader{R: src, CRC: bh.CRC, Limit: size}
		in = sum
	}
	s.MakeRoom(ctx, slot, len(bh.Tokens), false)
	ctx = shm.WithTransferChunk(ctx, s.tun.StateChunkSize())
	n, err := b.StatePut(ctx, slot, bh.Tokens, in, size)
	if sum != nil {
		err = checkTrailer(src, sum, bh.Size, err)
	}
	if err != nil {
		return 0, nil, "", err
	}
	ckpt := ""
	if bh.Checkpoint != nil {
		if ckpt, err = putCheckpoint(ctx, b, slot, bh.Checkpoint); err != nil {
			return 0, nil, "", err
		}
	}
	return n, source, ckpt, nil
}

// handleStateMeta answers from the host's slot table, so it works while the
// slot is busy.
func (s *Server) handleStateMeta(req *request, rp *replier) error {
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	st, err := s.slots.get(slot)
	if err != nil {
		return rp.failErr(err)
	}
	_, info := s.Backend()
	return rp.replyMeta(transport.StatusOK, st.source.addTo(transport.NewMeta().Add("slot_id", slot).Add("n_past", st.nPast).
		Add("state_size", st.stateSize).Add("is_processing", st.use == slotProcessing).
		Add("is_transferring", st.use == slotTransferring).AddFields(info.Model)), nil)
}
