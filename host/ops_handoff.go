//go:build unix

package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

// A slot's state handed to another engine on this host without a socket in
// the data path (ours, opt-in; docs/protocol.md): STATE_EXPORT creates a
// file of the shared memory directory (a tmpfs) holding a ring (shmring.go),
// replies with its path and the blob's size at once, and writes the slot's
// blob, the bytes STATE_GET would stream, through the ring; STATE_IMPORT on
// the other engine restores a slot from it as STATE_PUT does, reading each
// part as it is written, so the halves overlap and touch only the ring's
// memory. Either side that fails says so in the ring, and the other stops.
// The file belongs to the exporting connection: it is removed when that
// connection closes or exports again (its writer stopped first), so nothing
// is freed before the importer has replied to a client that holds the
// connection open meanwhile. Both ops answer only clients on the engines'
// Unix sockets, which are on this host.

// handoffCapability is INFO's name for these ops.
const handoffCapability = "state_shm"

// exportPrefix names the files STATE_EXPORT writes and STATE_IMPORT reads:
// hydra-state-PID-RANDOM.blob.
const exportPrefix = "hydra-state-"

// exportFile is a connection's live export: its file, and the writer's
// cancel and end while it writes.
type exportFile struct {
	path   string
	cancel context.CancelFunc
	done   chan struct{}
}

// set makes path the connection's export, written until done closes (nil:
// written), after stopping the writer of the one before and removing it.
func (e *exportFile) set(path string, cancel context.CancelFunc, done chan struct{}) {
	if e.cancel != nil {
		e.cancel()
		<-e.done
	}
	if e.path != "" {
		_ = os.Remove(e.path)
	}
	e.path, e.cancel, e.done = path, cancel, done
}

// remove removes the connection's export, if any, its writer stopped first.
func (e *exportFile) remove() { e.set("", nil, nil) }

// shmDir is the shared-memory directory of exports and imports.
func (s *Server) shmDir() string {
	if s.cfg.StateShmDir != "" {
		return filepath.Clean(s.cfg.StateShmDir)
	}
	return DefaultStateShmDir
}

// localOnly refuses op on a connection that is not a Unix socket's.
func localOnly(op transport.Op, rp *replier) error {
	return rp.fail(transport.StatusError, fmt.Sprintf("%v hands a state between engines on one host: send it over the engine's Unix socket (this connection is %s); STATE_GET and STATE_PUT move a state over any", op, rp.network))
}

// handleStateExport writes the slot's blob into a new file of the shared
// memory directory and replies with its path.
func (s *Server) handleStateExport(req *request, rp *replier) error {
	if rp.network != "unix" || req.export == nil {
		return localOnly(req.hdr.Op, rp)
	}
	bs, ok, err := s.openBlobSlot(req, rp, true)
	if !ok {
		return err
	}
	si := bs.si
	hdr, total := blobHeader(si, bs.x, 0)
	path, ring, err := s.createExport(total)
	if err != nil {
		bs.lease.release(nil)
		return rp.failErr(err)
	}
	// The writer outlives the request: it stops when the export is
	// replaced or its connection closes (exportFile), not with the reply.
	ctx, cancel := context.WithCancel(context.WithoutCancel(req.ctx))
	done := make(chan struct{})
	req.export.set(path, cancel, done)
	go func() {
		defer close(done)
		defer bs.lease.release(nil)
		s.writeExport(ctx, ring, bs.b, si, hdr, bs.x.Trailer, func() { bs.lease.release(nil) })
	}()
	m := transport.NewMeta().Add("path", path).Add("bytes", total).Add("n_past", si.NPast).Add("state_size", si.StateSize).AddFields(bs.info.Model)
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// createExport creates the file of an export in the shared memory
// directory, checked for room first, with the ring of a blob of total
// bytes in it, and returns its path and the ring (the mapping outlives the
// file's descriptor).
func (s *Server) createExport(total int64) (string, *shmRing, error) {
	dir := s.shmDir()
	reapExports(dir, s.log.Warn)
	if free, err := freeBytes(dir); err == nil && free < ringHeader+ringMax {
		return "", nil, fmt.Errorf("no room in %s for an export's %d-byte ring (%d bytes free): STATE_GET moves the state over the socket", dir, ringHeader+ringMax, free)
	}
	f, err := os.CreateTemp(dir, exportPrefix+strconv.Itoa(os.Getpid())+"-*.blob")
	if err != nil {
		return "", nil, fmt.Errorf("creating the export file in %s: %w", dir, err)
	}
	ring, err := createRing(f, total)
	f.Close()
	if err != nil {
		_ = os.Remove(f.Name())
		return "", nil, err
	}
	return f.Name(), ring, nil
}

// writeExport writes the blob, header hdr, the backend's state and, with
// trailer, the integrity trailer, through ring, and logs the
// transfer; a failure is written into the ring, for the reader. The last
// byte goes in once release has freed the slot, so an importer that has
// the whole blob never finds the source slot still busy (as STATE_GET).
func (s *Server) writeExport(ctx context.Context, ring *shmRing, b iface.Backend, si iface.SlotInfo, hdr []byte, trailer bool, release func()) {
	defer ring.close()
	start := time.Now()
	var trace shm.TransferTrace
	rw := &ringWriter{ctx: ctx, r: ring, wait: s.cfg.ChunkTimeout}
	cw := newBlobWriter(rw, trailer)
	_, err := cw.Write(hdr)
	if err == nil {
		_, err = b.StateGet(shm.WithTransferTrace(ctx, &trace), si.Slot, s.tun.StateChunkSize(), cw)
	}
	if err == nil {
		err = cw.writeTrailer()
	}
	if err == nil && cw.n != ring.total {
		err = fmt.Errorf("wrote %d bytes of the slot's %d-byte blob", cw.n, ring.total)
	}
	if err == nil {
		release()
		err = rw.flush()
	}
	if err != nil {
		ring.setState(ringWriterFailed)
	}
	s.transferDone(ctx, &replier{network: "unix"}, false, si.Slot, cw.n, start, trace, err)
}

// exportClaim is how long an export waits for its importer's first read
// before it gives the slot back: a client that exports and never imports
// must not hold the slot for the whole stall limit.
const exportClaim = 30 * time.Second

// ringWriter writes into an export's ring, waiting for the reader to make
// room: it gives up with the context, when the reader did, or after wait
// without room (exportClaim before a reader came).
type ringWriter struct {
	ctx   context.Context
	r     *shmRing
	wait  time.Duration
	since time.Time
	last  []byte // the blob's last byte, held back for flush
}

// Write writes p, all of it but the blob's last byte, which it holds back.
func (w *ringWriter) Write(p []byte) (int, error) {
	end := w.r.written() + int64(len(p))
	switch {
	case w.last != nil || end > w.r.total:
		return 0, fmt.Errorf("the backend wrote past the %d bytes announced", w.r.total)
	case end == w.r.total && len(p) > 0:
		w.last = []byte{p[len(p)-1]}
		if _, err := w.put(p[:len(p)-1]); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return w.put(p)
}

// flush writes the byte Write held back.
func (w *ringWriter) flush() error {
	_, err := w.put(w.last)
	return err
}

// put writes p into the ring, waiting for room.
func (w *ringWriter) put(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if k := w.r.put(p[n:]); k > 0 {
			n += k
			w.since = time.Time{}
			continue
		}
		limit := w.wait
		if !w.r.claimed() {
			limit = exportClaim
		}
		switch {
		case w.ctx.Err() != nil:
			return n, fmt.Errorf("the export was stopped: %w", w.ctx.Err())
		case w.r.state() == ringReaderGone:
			return n, errors.New("the importer gave up")
		case w.since.IsZero():
			w.since = time.Now()
		case time.Since(w.since) > limit:
			return n, fmt.Errorf("no importer made room in the ring for %v", limit)
		}
		time.Sleep(exportPoll)
	}
	return n, nil
}

// freeBytes is the room left in dir's file system.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// exportPID is the engine that named an export file, 0 if the name says
// none.
func exportPID(path string) int {
	pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(path), exportPrefix), "-", 2)[0])
	if err != nil {
		return 0
	}
	return pid
}

var reapOnce sync.Once

// reapExports removes, once a process, the export files of engines that
// are gone (a crash leaves its exports in shared memory).
func reapExports(dir string, warn func(string, ...any)) {
	reapOnce.Do(func() {
		names, _ := filepath.Glob(filepath.Join(dir, exportPrefix+"*-*.blob"))
		for _, name := range names {
			pid := exportPID(name)
			if pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
				continue
			}
			if err := os.Remove(name); err == nil {
				warn("removed the state export of an engine that is gone", "path", name, "pid", pid)
			}
		}
	})
}

// importRequest is STATE_IMPORT's payload: the export's path and, from its
// reply, the blob's size (0: the one its ring announces).
type importRequest struct {
	Path  string `json:"path"`
	Bytes int64  `json:"bytes"`
}

// handleStateImport restores the slot from an export file of another
// engine on this host, as STATE_PUT does from its payload.
func (s *Server) handleStateImport(req *request, rp *replier) error {
	if rp.network != "unix" {
		return localOnly(req.hdr.Op, rp)
	}
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	p, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	var ir importRequest
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ir); err != nil || ir.Path == "" {
		why := "no path"
		if err != nil {
			why = err.Error()
		}
		return rp.fail(transport.StatusError, fmt.Sprintf(`STATE_IMPORT payload must be {"path":"…","bytes":N}, from a STATE_EXPORT reply: %s`, why))
	}
	ring, err := s.openExport(ir.Path, ir.Bytes)
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	defer ring.close()
	g := &ringReader{r: ring, wait: s.cfg.ChunkTimeout, pid: exportPID(ir.Path)}
	src := &readTracker{r: &io.LimitedReader{R: g, N: ring.total}}
	err = s.putState(req, rp, slot, src, src, false, func(m *transport.Meta) { m.Add("path", ir.Path) })
	if ring.read() < ring.total {
		ring.setState(ringReaderGone) // the writer stops waiting for room
	}
	return err
}

// openExport maps the ring of path if it is an export file of this user in
// this engine's shared memory directory that no other import has taken
// and whose size is bytes (0: any): a client names the file, so nothing
// else may be read as a state.
func (s *Server) openExport(path string, bytes int64) (*shmRing, error) {
	dir := s.shmDir()
	base := filepath.Base(path)
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || filepath.Dir(path) != dir ||
		!strings.HasPrefix(base, exportPrefix) || !strings.HasSuffix(base, ".blob") {
		return nil, fmt.Errorf("%q is not a STATE_EXPORT file of %s (%s*.blob): this engine imports only those", path, dir, exportPrefix)
	}
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the export: %w (its engine removes it when the exporting connection closes)", err)
	}
	defer f.Close() // the mapping stays
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st, _ := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || st == nil || int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("%s is not a regular file of this user", path)
	}
	ring, err := openRing(f, fi.Size())
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, err)
	case bytes != 0 && bytes != ring.total:
		err = fmt.Errorf("bytes %d: the export holds %d", bytes, ring.total)
	case uint64(ring.total) > s.cfg.MaxStateBytes:
		err = fmt.Errorf("%s holds %d bytes, beyond the %d-byte state limit", path, ring.total, s.cfg.MaxStateBytes)
	case !ring.claim():
		err = fmt.Errorf("%s is being imported, or was: an export is read once", path)
	}
	if err != nil {
		ring.close()
		return nil, err
	}
	return ring, nil
}

// ringReader reads an export's ring as its engine writes it: it waits for
// more, and fails where the writer failed, its engine (pid, from the file's
// name) is gone, or nothing comes for wait.
type ringReader struct {
	r     *shmRing
	wait  time.Duration
	pid   int
	since time.Time
}

func (g *ringReader) Read(p []byte) (int, error) {
	for {
		if g.r.read() >= g.r.total {
			return 0, io.EOF
		}
		if k := g.r.take(p); k > 0 {
			g.since = time.Time{}
			return k, nil
		}
		switch {
		case g.r.state() == ringWriterFailed:
			return 0, fmt.Errorf("the export was cut off at its source after %d of %d bytes (its engine's log says why)", g.r.read(), g.r.total)
		case g.pid > 0 && syscall.Kill(g.pid, 0) == syscall.ESRCH:
			return 0, fmt.Errorf("the export's engine (pid %d) is gone after %d of %d bytes", g.pid, g.r.read(), g.r.total)
		case g.since.IsZero():
			g.since = time.Now()
		case time.Since(g.since) > g.wait:
			return 0, fmt.Errorf("the export stopped at %d of %d bytes for %v", g.r.read(), g.r.total, g.wait)
		}
		time.Sleep(exportPoll)
	}
}

// exportPoll is how often one side of an export looks for the other's
// progress: short beside a chunk's copy, long beside a system call.
const exportPoll = 50 * time.Microsecond
