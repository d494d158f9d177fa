package host

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// stateBackend answers Slot with a fixed sequence, StateGet as told and Info
// (INFO's liveness check) with nothing; the other methods are not used by
// these tests.
type stateBackend struct {
	iface.Backend
	stateGet func(w io.Writer) error
}

func (b *stateBackend) Slot(_ context.Context, slot int) (iface.SlotInfo, error) {
	return iface.SlotInfo{Slot: slot, NPast: 2, Tokens: []int32{1, 2}, StateSize: 100}, nil
}

func (b *stateBackend) SlotCheckpoint(context.Context, int) (*iface.Checkpoint, error) {
	return nil, nil
}

func (b *stateBackend) Info(context.Context) (iface.BackendInfo, error) {
	return iface.BackendInfo{}, nil
}

func (b *stateBackend) StateGet(_ context.Context, _ int, _ int, w io.Writer) (int64, error) {
	return 0, b.stateGet(w)
}

func stateGetOnce(t *testing.T, b *stateBackend) (transport.ResponseHeader, *Server, error) {
	t.Helper()
	s := NewServer(b, iface.BackendInfo{NSlots: 1}, nil, Config{})
	var out bytes.Buffer
	rp := &replier{w: bufio.NewWriter(&out)}
	req := &request{hdr: transport.RequestHeader{Op: transport.OpStateGet}, key: "0", ctx: t.Context(), payload: &io.LimitedReader{}}
	err := s.handleStateGet(req, rp)
	rp.w.Flush()
	var h transport.ResponseHeader
	if out.Len() >= transport.ResponseHeaderSize {
		h, _ = transport.ParseResponseHeader(out.Bytes())
	}
	return h, s, err
}

// TestStateGetRefusedBeforeFirstByte: a backend that fails before producing
// any state gets the client a framed error reply with the backend's status,
// the connection stays usable and the slot is free again.
func TestStateGetRefusedBeforeFirstByte(t *testing.T) {
	h, s, err := stateGetOnce(t, &stateBackend{stateGet: func(io.Writer) error {
		return fmt.Errorf("%w: slot 0 is still running an earlier operation", iface.ErrBusy)
	}})
	if err != nil {
		t.Fatalf("handler closed the connection: %v", err)
	}
	if h.Status != transport.StatusBusy {
		t.Fatalf("status %v, want BUSY", h.Status)
	}
	if st, _ := s.slots.get(0); st.use != slotIdle {
		t.Fatal("slot still held after the refusal")
	}
}

// TestStateGetFailsMidStream: once state bytes have gone out, a failure
// closes the connection (the announced payload cannot be completed).
func TestStateGetFailsMidStream(t *testing.T) {
	h, s, err := stateGetOnce(t, &stateBackend{stateGet: func(w io.Writer) error {
		w.Write(make([]byte, 10))
		return errors.New("device lost")
	}})
	var fatal errFatal
	if !errors.As(err, &fatal) {
		t.Fatalf("handler error %v, want a connection-closing one", err)
	}
	if h.Status != transport.StatusOK {
		t.Fatalf("status %v: the OK header should have gone out with the first bytes", h.Status)
	}
	if st, _ := s.slots.get(0); st.use != slotIdle {
		t.Fatal("slot still held after the failure")
	}
}
