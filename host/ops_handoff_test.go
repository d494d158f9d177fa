//go:build unix

package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// handoffServer serves a mock backend of 2 slots on a Unix socket and a TCP
// one, exports in dir; it returns a dialer of each.
func handoffServer(t *testing.T, dir string, wrap ...func(iface.Backend) iface.Backend) (b iface.Backend, unix func() *transport.Client, tcp func() *transport.Client) {
	t.Helper()
	b = mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	for _, w := range wrap {
		b = w(b)
	}
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, info, nil, Config{StateShmDir: dir})
	ul, err := net.Listen("unix", filepath.Join(t.TempDir(), "engine.sock"))
	if err != nil {
		t.Fatal(err)
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ul)
	go s.Serve(tl)
	t.Cleanup(s.Close)
	dial := func(addr string) func() *transport.Client {
		return func() *transport.Client {
			c, err := transport.DialClient(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
	}
	return b, dial("unix://" + ul.Addr().String()), dial("tcp://" + tl.Addr().String())
}

func importPayload(path string) []byte {
	p, _ := json.Marshal(map[string]string{"path": path})
	return p
}

// blobSplit is where a blob's header ends and how long its trailer is.
func blobSplit(t *testing.T, blob []byte) (head, tail int) {
	t.Helper()
	bh, err := transport.ReadBlobHeader(bytes.NewReader(blob), int64(len(blob)), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if bh.HasTrailer {
		tail = transport.TrailerSize
	}
	return int(bh.Size), tail
}

// ringFile writes an export's ring at path holding the first n bytes of
// blob (split as blobSplit says), its writer failed short of the whole
// blob where failed says, as an exporting engine would.
func ringFile(t *testing.T, path string, blob []byte, head, tail, n int, failed bool) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	state := len(blob) - head - tail
	r, err := createRing(f, blob[:head], int64(state), tail, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	w := newRingWriter(context.Background(), r, time.Second, false)
	if _, err := w.Write(blob[head : head+min(max(n-head, 0), state)]); err != nil {
		t.Fatal(err)
	}
	w.flush()
	switch {
	case n == len(blob):
		copy(r.tailBytes(), blob[len(blob)-tail:])
		r.setState(ringComplete)
	case failed:
		r.setState(ringWriterFailed)
	}
}

// exports lists dir's export files.
func exports(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, exportPrefix+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestStateExportImport: STATE_EXPORT writes the bytes STATE_GET streams
// into a file of the shared memory directory; STATE_IMPORT on another
// engine restores a slot from it that decodes as the source's; the file
// lives until the exporting connection exports again or closes; neither op
// answers over TCP.
func TestStateExportImport(t *testing.T) {
	dir := t.TempDir()
	srcB, srcUnix, srcTCP := handoffServer(t, dir)
	_, dstUnix, dstTCP := handoffServer(t, dir)
	src, dst := srcUnix(), dstUnix()
	if st, _, _ := call(t, src, transport.OpPrefill, "0", []byte(`{"messages":[{"role":"user","content":"a prompt to move"}]}`)); st != transport.StatusOK {
		t.Fatalf("PREFILL: %v", st)
	}
	_, _, want := call(t, src, transport.OpStateGet, "0", nil)
	st, meta, _ := call(t, src, transport.OpStateExport, "0", nil)
	path, _ := meta["path"].(string)
	if st != transport.StatusOK || path == "" || filepath.Dir(path) != dir {
		t.Fatalf("STATE_EXPORT: %v %v", st, meta)
	}
	if meta["bytes"] != float64(len(want)) {
		t.Fatalf("STATE_EXPORT announces %v bytes, STATE_GET streamed %d", meta["bytes"], len(want))
	}
	st, meta, _ = call(t, dst, transport.OpStateImport, "1", importPayload(path))
	if st != transport.StatusOK || meta["restored"] != true || meta["path"] != path {
		t.Fatalf("STATE_IMPORT: %v %v", st, meta)
	}
	if st, meta, _ := call(t, dst, transport.OpStateImport, "0", importPayload(path)); st != transport.StatusError ||
		!strings.Contains(fmt.Sprint(meta["error"]), "an export is read once") {
		t.Fatalf("a second import of one export: %v %v", st, meta)
	}
	if meta["n_past"] == nil || meta["n_past"] != metaOf(t, src, "0")["n_past"] {
		t.Fatalf("the imported slot holds %v tokens, the source %v", meta["n_past"], metaOf(t, src, "0")["n_past"])
	}
	srcTok, dstTok := decodeText(t, src, "0"), decodeText(t, dst, "1")
	if srcTok != dstTok {
		t.Fatalf("after the import the slots decode %q and %q", srcTok, dstTok)
	}

	// Blob options, and nothing else.
	for _, bad := range []string{`{"blob_layout":true,"slot":1}`, `not json`, `{"blob_trailer":"yes"}`} {
		if st, meta, _ := call(t, src, transport.OpStateExport, "0", []byte(bad)); st != transport.StatusError ||
			!strings.Contains(fmt.Sprint(meta["error"]), "blob options") {
			t.Errorf("STATE_EXPORT with %s: %v %v", bad, st, meta)
		}
	}

	// One export a connection: the next replaces it; closing removes it.
	st, meta, _ = call(t, src, transport.OpStateExport, "0", nil)
	if next, _ := meta["path"].(string); st != transport.StatusOK || next == path || len(exports(t, dir)) != 1 {
		t.Fatalf("a second export: %v %v, files %v", st, meta, exports(t, dir))
	}
	src.Close()
	waitFor(t, func() bool { return len(exports(t, dir)) == 0 }) // removed when its connection closed

	// Over TCP neither op is served, and the state is untouched.
	for _, c := range []*transport.Client{srcTCP(), dstTCP()} {
		for _, op := range []transport.Op{transport.OpStateExport, transport.OpStateImport} {
			st, meta, _ := call(t, c, op, "0", importPayload(path))
			if e, _ := meta["error"].(string); st != transport.StatusError || !strings.Contains(e, "Unix socket") {
				t.Errorf("%v over TCP: %v %v", op, st, meta)
			}
		}
	}
	if si, _ := srcB.Slot(context.Background(), 0); si.NPast == 0 {
		t.Fatal("the source slot was emptied")
	}
}

// metaOf is slot key's STATE_META.
func metaOf(t *testing.T, c *transport.Client, key string) map[string]any {
	t.Helper()
	_, meta, _ := call(t, c, transport.OpStateMeta, key, nil)
	return meta
}

// decodeText decodes a few greedy tokens in slot key and returns the text.
func decodeText(t *testing.T, c *transport.Client, key string) string {
	t.Helper()
	st, meta, _ := call(t, c, transport.OpDecode, key, []byte(`{"n_predict":8,"temperature":0}`))
	if text, _ := meta["text"].(string); st != transport.StatusOK || text == "" {
		t.Fatalf("DECODE slot %s: %v %v", key, st, meta)
	}
	return meta["text"].(string)
}

// TestStateImportRefusals: STATE_IMPORT reads only this user's export files
// of its shared memory directory, and a cut-off or corrupted export leaves
// the destination slot empty and its engine serving, 200 times over.
func TestStateImportRefusals(t *testing.T) {
	dir := t.TempDir()
	_, srcUnix, _ := handoffServer(t, dir)
	dstB, dstUnix, _ := handoffServer(t, dir)
	src, dst := srcUnix(), dstUnix()
	call(t, src, transport.OpPrefill, "0", []byte(`{"messages":[{"role":"user","content":"a prompt to move, somewhat longer"}]}`))
	_, _, blob := call(t, src, transport.OpStateGet, "0", nil) // the bytes an export writes
	_, meta, _ := call(t, src, transport.OpStateExport, "0", nil)
	path := meta["path"].(string)
	head, tail := blobSplit(t, blob)
	other := filepath.Join(t.TempDir(), filepath.Base(path))
	ringFile(t, other, blob, head, tail, len(blob), false)
	plain := filepath.Join(dir, exportPrefix+"1-plain.blob")
	if err := os.WriteFile(plain, blob, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, exportPrefix+"link.blob")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ payload, want string }{
		{`{"path":"/etc/passwd"}`, "not a STATE_EXPORT file"},
		{fmt.Sprintf(`{"path":%q}`, other), "not a STATE_EXPORT file"},
		{fmt.Sprintf(`{"path":%q}`, dir+"/../"+filepath.Base(dir)+"/"+filepath.Base(path)), "not a STATE_EXPORT file"},
		{fmt.Sprintf(`{"path":%q}`, link), "opening the export"},
		{fmt.Sprintf(`{"path":%q}`, filepath.Join(dir, exportPrefix+"1-gone.blob")), "opening the export"},
		{fmt.Sprintf(`{"path":%q}`, plain), "not an export's ring"},
		{fmt.Sprintf(`{"path":%q,"bytes":5}`, path), "bytes 5"},
		{`{"path":"x","slot":1}`, "must be"},
		{`not json`, "must be"},
	} {
		st, meta, _ := call(t, dst, transport.OpStateImport, "1", []byte(tc.payload))
		if e, _ := meta["error"].(string); st != transport.StatusError || !strings.Contains(e, tc.want) {
			t.Errorf("%s: %v %v, want an error saying %q", tc.payload, st, meta, tc.want)
		}
	}

	// Cut-offs and changed bytes at random points: refused, the slot empty.
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		b, n := bytes.Clone(blob), len(blob)
		if i%2 == 0 {
			n = r.IntN(len(b)) // the writer failed there
		} else {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		}
		cut := filepath.Join(dir, fmt.Sprintf("%s%d-trial%d.blob", exportPrefix, os.Getpid(), i))
		ringFile(t, cut, b, head, tail, n, n < len(b))
		st, meta, _ := call(t, dst, transport.OpStateImport, "1", importPayload(cut))
		os.Remove(cut)
		if st == transport.StatusOK {
			t.Fatalf("trial %d (%d of %d bytes): imported: %v", i, len(b), len(blob), meta)
		}
		if si, _ := dstB.Slot(context.Background(), 1); si.NPast != 0 {
			t.Fatalf("trial %d: the slot holds %d tokens after a refused import", i, si.NPast)
		}
	}
	if st, meta, _ := call(t, dst, transport.OpStateImport, "1", importPayload(path)); st != transport.StatusOK {
		t.Fatalf("the whole export after the trials: %v %v", st, meta)
	}
}

// throttled writes the mock's state slowly, and with fail stops halfway
// with an error, as a backend that dies mid-transfer.
type throttled struct {
	iface.Backend
	fail  bool
	armed atomic.Bool // from then on (PREFILL's own blob goes before)
}

func (b *throttled) StateGet(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
	if !b.armed.Load() {
		return b.Backend.StateGet(ctx, slot, chunk, w)
	}
	si, err := b.Slot(ctx, slot)
	if err != nil {
		return 0, err
	}
	return b.Backend.StateGet(ctx, slot, chunk, &slowWriter{w: w, limit: si.StateSize / 2, fail: b.fail})
}

type slowWriter struct {
	w     io.Writer
	n     int64
	limit int64
	fail  bool
}

func (s *slowWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		if s.fail && s.n >= s.limit {
			return n, errors.New("the device was lost")
		}
		k := min(len(p), 64<<10)
		m, err := s.w.Write(p[:k])
		n, s.n, p = n+m, s.n+int64(m), p[k:]
		if err != nil {
			return n, err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return n, nil
}

// TestStateImportWhileExporting: an import started as soon as the export
// replies reads the file as it is written and restores the slot; an export
// whose backend fails halfway is cut to nothing, and the import reading it
// fails with the slot empty; the source slot is free again after either.
func TestStateImportWhileExporting(t *testing.T) {
	for _, fail := range []bool{false, true} {
		dir := t.TempDir()
		var th *throttled
		srcB, srcUnix, _ := handoffServer(t, dir, func(b iface.Backend) iface.Backend { th = &throttled{Backend: b, fail: fail}; return th })
		dstB, dstUnix, _ := handoffServer(t, dir)
		src, dst := srcUnix(), dstUnix()
		call(t, src, transport.OpPrefill, "0", []byte(`{"messages":[{"role":"user","content":"a prompt to move while it is written"}]}`))
		th.armed.Store(true)
		_, meta, _ := call(t, src, transport.OpStateExport, "0", nil)
		payload, _ := json.Marshal(map[string]any{"path": meta["path"], "bytes": meta["bytes"]})
		if m := metaOf(t, src, "0"); m["is_transferring"] != true {
			t.Fatalf("fail %v: the export was written before its reply: %v", fail, m)
		}
		st, im, _ := call(t, dst, transport.OpStateImport, "1", payload)
		si, _ := dstB.Slot(context.Background(), 1)
		switch {
		case !fail && (st != transport.StatusOK || si.NPast == 0):
			t.Errorf("an import while exporting: %v %v, %d tokens", st, im, si.NPast)
		case fail && (st != transport.StatusError || !strings.Contains(fmt.Sprint(im["error"]), "cut off at its source") || si.NPast != 0):
			t.Errorf("an import of a failed export: %v %v, %d tokens", st, im, si.NPast)
		}
		waitFor(t, func() bool { m := metaOf(t, src, "0"); return m["is_transferring"] == false })
		if si, _ := srcB.Slot(context.Background(), 0); si.NPast == 0 {
			t.Errorf("fail %v: the source slot was emptied", fail)
		}
	}
}

// TestCreateRingRefused: a file the ring cannot be allocated in (here one
// opened read-only) is refused with an error, nothing mapped.
func TestCreateRingRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ring")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if r, err := createRing(f, []byte("header"), 1<<20, 0, 64<<10); err == nil {
		r.close()
		t.Fatal("a ring was made in a read-only file")
	}
}
