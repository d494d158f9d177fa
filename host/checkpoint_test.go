package host

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"reflect"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport"
)

// ckptBackend is the mock with context checkpoints: each slot's newest is
// what the test sets, and what STATE_PUT hands over is recorded.
type ckptBackend struct {
	iface.Backend
	mu     sync.Mutex
	newest *iface.Checkpoint
	put    []iface.Checkpoint
	refuse error
}

func (c *ckptBackend) SlotCheckpoint(context.Context, int) (*iface.Checkpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newest, nil
}

func (c *ckptBackend) PutCheckpoint(_ context.Context, _ int, cp iface.Checkpoint) (bool, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refuse != nil {
		return false, "", c.refuse
	}
	c.put = append(c.put, cp)
	return true, "", nil
}

func ckptServer(t *testing.T, b iface.Backend) *transport.Client {
	t.Helper()
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(b, info, nil, Config{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	t.Cleanup(s.Close)
	c, err := transport.DialClient(context.Background(), "tcp://"+l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// call sends one request and returns the reply's status, meta and payload.
func call(t *testing.T, c *transport.Client, op transport.Op, key string, payload []byte) (transport.Status, map[string]any, []byte) {
	t.Helper()
	resp, err := c.Do(context.Background(), transport.Request{Op: op, Key: key, Payload: bytes.NewReader(payload), PayloadLen: uint64(len(payload))})
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var meta map[string]any
	if len(resp.Meta) > 0 {
		if err := json.Unmarshal(resp.Meta, &meta); err != nil {
			t.Fatalf("meta %s: %v", resp.Meta, err)
		}
	}
	return resp.Status, meta, body
}

// TestCheckpointInBlob: STATE_GET and PREFILL write the slot's newest
// context checkpoint into the blob as the reference engine does (flags
// bit0, inside the integrity trailer's sum), unless the client asks
// blob_checkpoint false; STATE_PUT reads it and hands it to the backend
// after the state, saying in its reply what became of it; a checkpoint the
// backend refuses fails the STATE_PUT and leaves the slot empty.
func TestCheckpointInBlob(t *testing.T) {
	m := mock.New(nil)
	cp := &iface.Checkpoint{PosMin: 5, PosMax: 5, NTokens: 6, Target: bytes.Repeat([]byte("rs"), 70000)}
	b := &ckptBackend{Backend: m, newest: cp}
	c := ckptServer(t, b)
	prefill := []byte(`{"messages":[{"role":"user","content":"a prompt long enough"}]}`)
	st, _, blob := call(t, c, transport.OpPrefill, "0", prefill)
	if st != transport.StatusOK {
		t.Fatalf("PREFILL: %v", st)
	}
	h, err := transport.ReadBlobHeader(bytes.NewReader(blob), int64(len(blob)), 0)
	if err != nil || h.Checkpoint == nil || !bytes.Equal(h.Checkpoint.Target, cp.Target) || h.Checkpoint.NTokens != 6 {
		t.Fatalf("PREFILL's blob: checkpoint %+v, %v", h.Checkpoint, err)
	}
	st, _, blob = call(t, c, transport.OpStateGet, "0", nil)
	h, err = transport.ReadBlobHeader(bytes.NewReader(blob), int64(len(blob)), 0)
	if st != transport.StatusOK || err != nil || h.Checkpoint == nil || h.Checkpoint.PosMax != 5 || !h.HasTrailer {
		t.Fatalf("STATE_GET %v: %+v %v", st, h, err)
	}
	st, meta, _ := call(t, c, transport.OpStatePut, "1", blob)
	want := iface.Checkpoint{PosMin: 5, PosMax: 5, NTokens: 6, Target: cp.Target, Draft: []byte{}}
	if st != transport.StatusOK || meta["checkpoint"] != "kept" || len(b.put) != 1 || !reflect.DeepEqual(b.put[0], want) {
		t.Fatalf("STATE_PUT %v %v: the backend got %d checkpoints", st, meta, len(b.put))
	}

	// Opted out: no checkpoint, and STATE_PUT says nothing of one.
	_, _, bare := call(t, c, transport.OpStateGet, "0", []byte(`{"blob_checkpoint":false}`))
	if h, err := transport.ReadBlobHeader(bytes.NewReader(bare), int64(len(bare)), 0); err != nil || h.Checkpoint != nil {
		t.Fatalf("blob_checkpoint false: %+v %v", h.Checkpoint, err)
	}
	if st, meta, _ := call(t, c, transport.OpStatePut, "1", bare); st != transport.StatusOK || meta["checkpoint"] != nil {
		t.Fatalf("STATE_PUT without a checkpoint: %v %v", st, meta)
	}

	// A byte of the checkpoint changed on the way: the trailer catches it.
	bad := bytes.Clone(blob)
	bad[h.Size-8-100] ^= 1 // inside the checkpoint's target bytes, before its draft size
	if st, meta, _ := call(t, c, transport.OpStatePut, "1", bad); st != transport.StatusError {
		t.Fatalf("a corrupted checkpoint: %v %v", st, meta)
	}

	// Refused by the backend: an error, the slot emptied.
	b.refuse = fmt.Errorf("%w: it does not fit", iface.ErrBadRequest)
	st, meta, _ = call(t, c, transport.OpStatePut, "1", blob)
	if st != transport.StatusError || meta["error"] == nil {
		t.Fatalf("a refused checkpoint: %v %v", st, meta)
	}
	if si, _ := m.Slot(context.Background(), 1); si.NPast != 0 {
		t.Fatalf("the slot holds %d tokens after a refused checkpoint", si.NPast)
	}
}

// TestCheckpointDeclined: a backend that needs no checkpoints (the mock's
// memory can be cut anywhere) restores the state and says why it did not
// keep the blob's checkpoint.
func TestCheckpointDeclined(t *testing.T) {
	src := ckptServer(t, &ckptBackend{Backend: mock.New(nil), newest: &iface.Checkpoint{PosMax: 1, NTokens: 2, Target: []byte("x")}})
	call(t, src, transport.OpPrefill, "0", []byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	_, _, blob := call(t, src, transport.OpStateGet, "0", nil)
	dst := ckptServer(t, mock.New(nil))
	st, meta, _ := call(t, dst, transport.OpStatePut, "0", blob)
	why, _ := meta["checkpoint"].(string)
	if st != transport.StatusOK || why != "not kept: the mock's memory can be cut anywhere: it keeps no checkpoints" {
		t.Fatalf("STATE_PUT %v %v", st, meta)
	}
}
