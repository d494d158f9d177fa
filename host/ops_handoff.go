//go:build unix

package host

import (
	"bytes"
	"context"
	"encoding/json"
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
	tail := 0
	if bs.x.Trailer {
		tail = transport.TrailerSize
	}
	path, ring, err := s.createExport(hdr, si.StateSize, tail)
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
		s.writeExport(ctx, ring, bs.b, si, bs.x.Trailer, func() { bs.lease.release(nil) })
	}()
	m := transport.NewMeta().Add("path", path).Add("bytes", total).Add("n_past", si.NPast).Add("state_size", si.StateSize).AddFields(bs.info.Model)
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// createExport creates the file of an export in the shared memory
// directory, checked for room first, with the ring of a blob of header hdr,
// state bytes and a trailer of tail bytes in it, and returns its path and
// the ring.
func (s *Server) createExport(hdr []byte, state int64, tail int) (string, *handoffRing, error) {
	dir := s.shmDir()
	reapExports(dir, s.log.Warn)
	chunk, depth := ringGeometry(s.tun.StateChunkSize(), state)
	need := int64(chunk*depth) + pageUp(int64(len(hdr)+tail)) + ringPage
	if free, err := freeBytes(dir); err == nil && free < need {
		return "", nil, fmt.Errorf("no room in %s for an export's %d-byte ring (%d bytes free): STATE_GET moves the state over the socket", dir, need, free)
	}
	f, err := os.CreateTemp(dir, exportPrefix+strconv.Itoa(os.Getpid())+"-*.blob")
	if err != nil {
		return "", nil, fmt.Errorf("creating the export file in %s: %w", dir, err)
	}
	ring, err := createRing(f, hdr, state, tail, s.tun.StateChunkSize())
	if err != nil {
		f.Close()
		_ = os.Remove(f.Name())
		return "", nil, err
	}
	return f.Name(), ring, nil
}

// writeExport writes the slot's state through ring, its plugin filling the
// buffers in place where the backend can (shm.SharedGetter), else copied in,
// then the integrity trailer, with trailer, and logs the transfer; a failure
// is written into the ring, for the reader. The ring is marked complete
// once release has freed the slot, and the importer replies only then, so
// one that has the whole blob never finds the source slot still busy (as
// STATE_GET).
func (s *Server) writeExport(ctx context.Context, ring *handoffRing, b iface.Backend, si iface.SlotInfo, trailer bool, release func()) {
	defer ring.close()
	start := time.Now()
	var trace shm.TransferTrace
	tctx := shm.WithTransferTrace(ctx, &trace)
	rw := newRingWriter(ctx, ring, s.cfg.ChunkTimeout, trailer)
	var err error
	if g, ok := b.(shm.SharedGetter); ok {
		_, err = g.StateGetShared(tctx, si.Slot, ring.shared(), rw)
	} else if _, err = b.StateGet(tctx, si.Slot, s.tun.StateChunkSize(), rw); err == nil {
		rw.flush() // the last buffer, short of a chunk
	}
	if state := rw.n - int64(ring.head); err == nil && state != ring.state() {
		err = fmt.Errorf("wrote %d bytes of the slot's %d-byte state", state, ring.state())
	}
	if err == nil && trailer {
		transport.AppendTrailer(ring.tailBytes()[:0], rw.crc, uint64(rw.n))
	}
	if err == nil {
		release()
		ring.setState(ringComplete)
	} else {
		ring.setState(ringWriterFailed)
	}
	moved := rw.n
	if err == nil {
		moved += int64(ring.tail)
	}
	s.transferDone(ctx, &replier{network: "unix"}, false, si.Slot, moved, start, trace, err)
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
	hr := &handoffReader{r: ring, wait: s.cfg.ChunkTimeout, pid: exportPID(ir.Path)}
	src := &readTracker{r: &io.LimitedReader{R: hr, N: ring.total}}
	hr.moved = func(n int) { src.r.N -= int64(n); src.read(n) }
	// The restore counts only once the source says its last byte was right
	// and its slot is free: a writer failing at the end fails the import,
	// and an importer that replied never finds the source slot still busy.
	err = s.putState(req, rp, slot, src, importSource{src, hr}, false, hr.awaitComplete, func(m *transport.Meta) { m.Add("path", ir.Path) })
	if hr.pos < ring.total {
		ring.setState(ringReaderGone) // the writer stops waiting for room
	}
	return err
}

// importSource is an import's blob as putState reads it: a stream, counted
// by its readTracker, whose state a data plane may instead take from the
// ring in place (shm.SharedSource).
type importSource struct {
	*readTracker
	h *handoffReader
}

var _ shm.SharedSource = importSource{}

func (s importSource) Shared() shm.SharedRing                         { return s.h.r.shared() }
func (s importSource) Next(ctx context.Context) (k, n int, err error) { return s.h.Next(ctx) }
func (s importSource) Free()                                          { s.h.r.free() }

// openExport maps the ring of path if it is an export file of this user in
// this engine's shared memory directory that no other import has taken
// and whose size is bytes (0: any): a client names the file, so nothing
// else may be read as a state.
func (s *Server) openExport(path string, bytes int64) (*handoffRing, error) {
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
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if st, _ := fi.Sys().(*syscall.Stat_t); !fi.Mode().IsRegular() || st == nil || int(st.Uid) != os.Getuid() {
		f.Close()
		return nil, fmt.Errorf("%s is not a regular file of this user", path)
	}
	ring, err := openRing(f, fi.Size())
	switch {
	case err != nil:
		f.Close()
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
