package host

import (
	"bufio"
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
// file of the shared memory directory (a tmpfs), replies with its path and
// size at once, and writes the slot's blob, the bytes STATE_GET would
// stream, into it; STATE_IMPORT on the other engine restores a slot from
// that file as STATE_PUT does, reading each part as soon as it is written,
// so the two halves overlap as a socket's would. A writer that fails cuts
// the file to nothing and takes its permissions away, which the reader
// takes as the end. The file belongs
// to the exporting connection: it is removed when that connection closes or
// exports again (its writer stopped first), so nothing is freed before the
// importer has replied to a client that holds the connection open
// meanwhile. Both ops answer only clients on the engines' Unix sockets,
// which are on this host.

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
	slot, ok, err := slotKey(req, rp)
	if !ok {
		return err
	}
	var opts blobOptions
	if req.payload.N > 0 {
		p, ok, err := s.readPayload(req, rp)
		if !ok {
			return err
		}
		if opts, err = parseBlobOptions(p); err != nil {
			return rp.fail(transport.StatusError, err.Error())
		}
	}
	lease, err := s.slots.acquire(slot, slotTransferring)
	if err != nil {
		return rp.failErr(err)
	}
	b, info, err := s.backendFor(lease)
	var x transport.BlobExtras
	if err == nil {
		x, err = s.blobExtras(opts, info)
	}
	var si iface.SlotInfo
	if err == nil {
		si, err = b.Slot(req.ctx, slot)
	}
	if err != nil {
		lease.release(nil)
		return rp.failErr(err)
	}
	s.withCheckpoint(req.ctx, b, slot, opts, &x)
	hdr := transport.AppendBlobHeader(make([]byte, 0, transport.BlobHeaderSize(len(si.Tokens), x)), si.NPast, si.Tokens, x)
	total := int64(len(hdr)) + si.StateSize
	if x.Trailer {
		total += transport.TrailerSize
	}
	f, err := s.createExport(total)
	if err != nil {
		lease.release(nil)
		return rp.failErr(err)
	}
	// The writer outlives the request: it stops when the export is
	// replaced or its connection closes (exportFile), not with the reply.
	ctx, cancel := context.WithCancel(context.WithoutCancel(req.ctx))
	done := make(chan struct{})
	req.export.set(f.Name(), cancel, done)
	go func() {
		defer close(done)
		defer lease.release(nil)
		s.writeExport(ctx, f, b, si, hdr, x.Trailer, total)
	}()
	m := transport.NewMeta().Add("path", f.Name()).Add("bytes", total).Add("n_past", si.NPast).Add("state_size", si.StateSize).AddFields(info.Model)
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// createExport creates the file of an export of total bytes in the shared
// memory directory, checked for room first.
func (s *Server) createExport(total int64) (*os.File, error) {
	dir := s.shmDir()
	reapExports(dir, s.log.Warn)
	if free, err := freeBytes(dir); err == nil && free < total {
		return nil, fmt.Errorf("no room in %s for the slot's %d-byte state (%d bytes free): STATE_GET moves it over the socket", dir, total, free)
	}
	f, err := os.CreateTemp(dir, exportPrefix+strconv.Itoa(os.Getpid())+"-*.blob")
	if err != nil {
		return nil, fmt.Errorf("creating the export file in %s: %w", dir, err)
	}
	return f, nil
}

// writeExport writes the blob, header hdr, the backend's state and, with
// trailer, the integrity trailer, to f, and logs the transfer; a failure
// cuts f to nothing and takes its permissions away, which its reader takes
// as the end.
func (s *Server) writeExport(ctx context.Context, f *os.File, b iface.Backend, si iface.SlotInfo, hdr []byte, trailer bool, total int64) {
	start := time.Now()
	var trace shm.TransferTrace
	bw := bufio.NewWriterSize(f, 1<<20)
	cw := &countingWriter{w: bw}
	var sw *sumWriter
	if trailer {
		sw = &sumWriter{w: bw}
		cw.w = sw
	}
	_, err := cw.Write(hdr)
	if err == nil {
		_, err = b.StateGet(shm.WithTransferTrace(ctx, &trace), si.Slot, s.tun.StateChunkSize(), cw)
	}
	if err == nil && sw != nil {
		var t [transport.TrailerSize]byte
		_, err = cw.Write(transport.AppendTrailer(t[:0], sw.crc, uint64(sw.n)))
	}
	if err == nil {
		err = bw.Flush()
	}
	if err == nil && cw.n != total {
		err = fmt.Errorf("wrote %d bytes of the slot's %d-byte blob", cw.n, total)
	}
	if err != nil {
		// The reader's sign: nothing left, and no permission.
		_ = f.Truncate(0)
		_ = f.Chmod(0)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	s.transferDone(ctx, &replier{network: "unix"}, false, si.Slot, cw.n, start, trace, err)
}

// freeBytes is the room left in dir's file system.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
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
// reply, its size (the file may still be growing; 0: the file's own).
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
		return rp.fail(transport.StatusError, fmt.Sprintf(`STATE_IMPORT payload must be {"path":"…"}, a STATE_EXPORT reply's path: %v`, err))
	}
	f, size, err := s.openExport(ir.Path, ir.Bytes)
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	defer f.Close()
	g := &growingReader{f: f, size: size, wait: s.cfg.ChunkTimeout, pid: exportPID(ir.Path)}
	src := &readTracker{r: &io.LimitedReader{R: g, N: size}}
	return s.putState(req, rp, slot, src, src, false, func(m *transport.Meta) { m.Add("path", ir.Path) })
}

// openExport opens path if it is an export file of this user in this
// engine's shared memory directory, and returns it with its size (bytes, or
// the file's own when 0): a client names the file, so nothing else may be
// read as a state.
func (s *Server) openExport(path string, bytes int64) (*os.File, int64, error) {
	dir := s.shmDir()
	base := filepath.Base(path)
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || filepath.Dir(path) != dir ||
		!strings.HasPrefix(base, exportPrefix) || !strings.HasSuffix(base, ".blob") {
		return nil, 0, fmt.Errorf("%q is not a STATE_EXPORT file of %s (%s*.blob): this engine imports only those", path, dir, exportPrefix)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("opening the export: %w (its engine removes it when the exporting connection closes)", err)
	}
	fi, err := f.Stat()
	if err == nil {
		st, _ := fi.Sys().(*syscall.Stat_t)
		switch {
		case !fi.Mode().IsRegular():
			err = fmt.Errorf("%s is not a regular file", path)
		case st == nil || int(st.Uid) != os.Getuid():
			err = fmt.Errorf("%s belongs to another user", path)
		case bytes < 0 || (bytes > 0 && bytes < fi.Size()):
			err = fmt.Errorf("bytes %d: the export already holds %d", bytes, fi.Size())
		case bytes == 0:
			bytes = fi.Size()
		}
		if err == nil && uint64(bytes) > s.cfg.MaxStateBytes {
			err = fmt.Errorf("%s holds %d bytes, beyond the %d-byte state limit", path, bytes, s.cfg.MaxStateBytes)
		}
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, bytes, nil
}

// growingReader reads an export its engine may still be writing: at the end
// of what is there it waits for more, up to size; a file cut short (its
// writer failed), whose engine (pid, from its name) is gone, or that stops
// growing for wait ends the read with an error.
type growingReader struct {
	f         *os.File
	off, size int64
	wait      time.Duration
	pid       int
}

func (g *growingReader) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), g.size-g.off)]
	var since time.Time
	for {
		n, err := g.f.ReadAt(p, g.off)
		if n > 0 {
			g.off += int64(n)
			return n, nil
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		fi, err := g.f.Stat()
		switch {
		case err != nil:
			return 0, err
		case fi.Size() < g.off || fi.Mode().Perm() == 0:
			return 0, fmt.Errorf("the export was cut off at its source after %d of %d bytes (its engine's log says why)", g.off, g.size)
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > g.wait:
			return 0, fmt.Errorf("the export stopped growing at %d of %d bytes for %v", g.off, g.size, g.wait)
		case g.pid > 0 && syscall.Kill(g.pid, 0) == syscall.ESRCH:
			return 0, fmt.Errorf("the export's engine (pid %d) is gone after %d of %d bytes", g.pid, g.off, g.size)
		}
		time.Sleep(exportPoll)
	}
}

// exportPoll is how often an import looks for more of an export being
// written: short beside a chunk's writing, long beside a system call.
const exportPoll = 50 * time.Microsecond
