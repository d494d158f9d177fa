package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// handoffServer serves a mock backend of 2 slots on a Unix socket and a TCP
// one, exports in dir; it returns a dialer of each.
func handoffServer(t *testing.T, dir string) (b iface.Backend, unix func() *transport.Client, tcp func() *transport.Client) {
	t.Helper()
	b = mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2})
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
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) || meta["bytes"] != float64(len(want)) {
		t.Fatalf("the export holds %d bytes (%v), STATE_GET streamed %d; reply %v", len(got), err, len(want), meta)
	}
	st, meta, _ = call(t, dst, transport.OpStateImport, "1", importPayload(path))
	if st != transport.StatusOK || meta["restored"] != true || meta["path"] != path {
		t.Fatalf("STATE_IMPORT: %v %v", st, meta)
	}
	if meta["n_past"] == nil || meta["n_past"] != metaOf(t, src, "0")["n_past"] {
		t.Fatalf("the imported slot holds %v tokens, the source %v", meta["n_past"], metaOf(t, src, "0")["n_past"])
	}
	srcTok, dstTok := decodeText(t, src, "0"), decodeText(t, dst, "1")
	if srcTok != dstTok {
		t.Fatalf("after the import the slots decode %q and %q", srcTok, dstTok)
	}

	// One export a connection: the next replaces it; closing removes it.
	st, meta, _ = call(t, src, transport.OpStateExport, "0", nil)
	if next, _ := meta["path"].(string); st != transport.StatusOK || next == path || len(exports(t, dir)) != 1 {
		t.Fatalf("a second export: %v %v, files %v", st, meta, exports(t, dir))
	}
	src.Close()
	waitFor(t, func() bool { return len(exports(t, dir)) == 0 }) // removed when its connection closed
	src = srcUnix()

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
	_, meta, _ := call(t, src, transport.OpStateExport, "0", nil)
	path := meta["path"].(string)
	blob, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(other, blob, 0o600); err != nil {
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
		b := bytes.Clone(blob)
		if i%2 == 0 {
			b = b[:r.IntN(len(b))]
		} else {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		}
		cut := filepath.Join(dir, fmt.Sprintf("%s%d-trial%d.blob", exportPrefix, os.Getpid(), i))
		if err := os.WriteFile(cut, b, 0o600); err != nil {
			t.Fatal(err)
		}
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
