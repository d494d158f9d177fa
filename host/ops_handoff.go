package host

import (
	"bufio"
	"bytes"
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
// the data path (ours, opt-in; docs/protocol.md): STATE_EXPORT writes the
// slot's blob, the bytes STATE_GET would stream, into a file of the shared
// memory directory (a tmpfs) and replies with its path; STATE_IMPORT on the
// other engine restores a slot from that file as STATE_PUT does. The file
// belongs to the exporting connection: it is removed when that connection
// closes or exports again, so nothing is freed before the importer has
// replied to a client that holds the connection open meanwhile. Both ops
// answer only clients on the engines' Unix sockets, which are on this host.

// exportPrefix names the files STATE_EXPORT writes and STATE_IMPORT reads:
// hydra-state-PID-RANDOM.blob.
const exportPrefix = "hydra-state-"

// exportFile is a connection's live export.
type exportFile struct{ path string }

// set makes path the connection's export, removing the one before.
func (e *exportFile) set(path string) {
	if e.path != "" {
		_ = os.Remove(e.path)
	}
	e.path = path
}

// remove removes the connection's export, if any.
func (e *exportFile) remove() { e.set("") }

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
	defer lease.release(nil)
	b, info, err := s.backendFor(lease)
	if err != nil {
		return rp.failErr(err)
	}
	x, err := s.blobExtras(opts, info)
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	si, err := b.Slot(req.ctx, slot)
	if err != nil {
		return rp.failErr(err)
	}
	s.withCheckpoint(req.ctx, b, slot, opts, &x)
	start := time.Now()
	path, n, err := s.exportBlob(req, b, si, x)
	s.transferDone(req.ctx, rp, false, slot, n, start, shm.TransferTrace{}, err)
	if err != nil {
		return rp.failErr(err)
	}
	lease.release(nil)
	req.export.set(path)
	m := transport.NewMeta().Add("path", path).Add("bytes", n).Add("n_past", si.NPast).Add("state_size", si.StateSize).AddFields(info.Model)
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// exportBlob writes si's blob with the extras x into a new file of the
// shared memory directory, checked for room first, and returns its path and
// size; on a failure the file is gone.
func (s *Server) exportBlob(req *request, b iface.Backend, si iface.SlotInfo, x transport.BlobExtras) (string, int64, error) {
	dir := s.shmDir()
	reapExports(dir, s.log.Warn)
	hdr := transport.AppendBlobHeader(make([]byte, 0, transport.BlobHeaderSize(len(si.Tokens), x)), si.NPast, si.Tokens, x)
	total := int64(len(hdr)) + si.StateSize
	if x.Trailer {
		total += transport.TrailerSize
	}
	if free, err := freeBytes(dir); err == nil && free < total {
		return "", 0, fmt.Errorf("no room in %s for the slot's %d-byte state (%d bytes free): STATE_GET moves it over the socket", dir, total, free)
	}
	f, err := os.CreateTemp(dir, exportPrefix+strconv.Itoa(os.Getpid())+"-*.blob")
	if err != nil {
		return "", 0, fmt.Errorf("creating the export file in %s: %w", dir, err)
	}
	n, err := writeBlob(req, f, b, si, hdr, x.Trailer, s.tun.StateChunkSize())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n != total {
		err = fmt.Errorf("wrote %d bytes of the slot's %d-byte blob", n, total)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		if errors.Is(err, syscall.ENOSPC) {
			err = fmt.Errorf("%s filled up while exporting (%w): STATE_GET moves the state over the socket", dir, err)
		}
		return "", 0, err
	}
	return f.Name(), n, nil
}

// writeBlob writes the blob, header hdr, the backend's state and, with
// trailer, the integrity trailer, to f.
func writeBlob(req *request, f *os.File, b iface.Backend, si iface.SlotInfo, hdr []byte, trailer bool, chunk int) (int64, error) {
	bw := bufio.NewWriterSize(f, 1<<20)
	cw := &countingWriter{w: bw}
	var sw *sumWriter
	if trailer {
		sw = &sumWriter{w: bw}
		cw.w = sw
	}
	if _, err := cw.Write(hdr); err != nil {
		return cw.n, err
	}
	if _, err := b.StateGet(req.ctx, si.Slot, chunk, cw); err != nil {
		return cw.n, err
	}
	if sw != nil {
		var t [transport.TrailerSize]byte
		if _, err := cw.Write(transport.AppendTrailer(t[:0], sw.crc, uint64(sw.n))); err != nil {
			return cw.n, err
		}
	}
	return cw.n, bw.Flush()
}

// freeBytes is the room left in dir's file system.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

var reapOnce sync.Once

// reapExports removes, once a process, the export files of engines that
// are gone (a crash leaves its exports in shared memory).
func reapExports(dir string, warn func(string, ...any)) {
	reapOnce.Do(func() {
		names, _ := filepath.Glob(filepath.Join(dir, exportPrefix+"*-*.blob"))
		for _, name := range names {
			pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(name), exportPrefix), "-", 2)[0])
			if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
				continue
			}
			if err := os.Remove(name); err == nil {
				warn("removed the state export of an engine that is gone", "path", name, "pid", pid)
			}
		}
	})
}

// importRequest is STATE_IMPORT's payload.
type importRequest struct {
	Path string `json:"path"`
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
	f, size, err := s.openExport(ir.Path)
	if err != nil {
		return rp.fail(transport.StatusError, err.Error())
	}
	defer f.Close()
	src := &readTracker{r: &io.LimitedReader{R: bufio.NewReaderSize(f, 1<<20), N: size}}
	return s.putState(req, rp, slot, src, src, false, func(m *transport.Meta) { m.Add("path", ir.Path) })
}

// openExport opens path if it is an export file of this user in this
// engine's shared memory directory, and returns it with its size: a client
// names the file, so nothing else may be read as a state.
func (s *Server) openExport(path string) (*os.File, int64, error) {
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
		case uint64(fi.Size()) > s.cfg.MaxStateBytes:
			err = fmt.Errorf("%s holds %d bytes, beyond the %d-byte state limit", path, fi.Size(), s.cfg.MaxStateBytes)
		}
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}
