package host

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// quantBackend swaps quantisations and switches expert modes as a real
// backend reports them: its info follows what it did.
type quantBackend struct {
	stateBackend
	info iface.BackendInfo
}

func (b *quantBackend) Info(context.Context) (iface.BackendInfo, error) { return b.info, nil }

func (b *quantBackend) SwapQuant(_ context.Context, key, pattern string) (iface.SwapResult, error) {
	if key != "q8" {
		return iface.SwapResult{}, iface.ErrBadRequest
	}
	b.info.ActiveQuant, b.info.Model.Hash = "base+q8", "mix"
	return iface.SwapResult{Swapped: 12, Bytes: 1 << 20, Duration: 1500 * time.Microsecond, KVPreserved: true}, nil
}

func (b *quantBackend) SetExpertMode(_ context.Context, mode string) (string, error) {
	b.info.ExpertMode = mode
	return mode, nil
}

// handle runs one control op and returns its status and meta.
func handle(t *testing.T, s *Server, h func(*request, *replier) error, payload []byte) (transport.Status, []byte) {
	t.Helper()
	st, meta, _ := handleKey(t, h, "worker-1", payload)
	return st, meta
}

// handleKey runs one op on key and returns its status, meta and payload.
func handleKey(t *testing.T, h func(*request, *replier) error, key string, payload []byte) (transport.Status, []byte, []byte) {
	t.Helper()
	var out bytes.Buffer
	rp := &replier{w: bufio.NewWriter(&out)}
	req := &request{key: key, ctx: t.Context(), payload: &io.LimitedReader{R: bytes.NewReader(payload), N: int64(len(payload))}}
	if err := h(req, rp); err != nil {
		t.Fatal(err)
	}
	rp.w.Flush()
	hdr, err := transport.ParseResponseHeader(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	body := out.Bytes()[transport.ResponseHeaderSize:]
	return hdr.Status, body[:hdr.MetaLen], body[hdr.MetaLen:]
}

// TestSwapQuantReplyAndIdentity: SWAP_QUANT replies with what the backend
// did, the reference's keys first, and INFO and every later reply carry the
// identity and quantisations the backend reports after the swap.
func TestSwapQuantReplyAndIdentity(t *testing.T) {
	b := &quantBackend{info: iface.BackendInfo{Name: "q", NSlots: 1, Model: iface.ModelIdentity{Alias: "m", Hash: "base", Path: "/m"},
		Quants: []string{"base", "q8"}, ActiveQuant: "base", ExpertMode: "solo", PeerDevice: "CUDA1", PeerReachable: true,
		LayerSplit: "0-47:CUDA0", SplitMode: "layer"}}
	s := NewServer(b, b.info, nil, Config{})
	payload := append(binary.LittleEndian.AppendUint16(nil, 2), "q8.*exps"...)
	st, meta := handle(t, s, s.handleSwapQuant, payload)
	want := `{"success":true,"swapped":12,"bytes":1048576,"swap_ms":1.5,"kv_preserved":true,"quant_key":"q8","tensor_pattern":".*exps",` +
		`"active_quant":"base+q8","model_alias":"m","model_hash":"mix","model_path":"/m"}`
	if st != transport.StatusOK || string(meta) != want {
		t.Fatalf("SWAP_QUANT: %v %s", st, meta)
	}
	if _, info := s.Backend(); info.Model.Hash != "mix" {
		t.Fatalf("the server's identity after the swap: %+v", info.Model)
	}
	st, meta = handle(t, s, s.handleSwapQuant, append(binary.LittleEndian.AppendUint16(nil, 2), "q4.*"...))
	if st != transport.StatusError || !strings.Contains(string(meta), `"success":false`) {
		t.Fatalf("a refused swap: %v %s", st, meta)
	}

	handle(t, s, s.handleSetExpertMode, []byte("combined"))
	_, meta = handle(t, s, s.handleInfo, nil)
	var m map[string]any
	if err := json.Unmarshal(meta, &m); err != nil {
		t.Fatal(err)
	}
	caps, _ := json.Marshal(m["capabilities"])
	if m["mode"] != "combined" || m["solo_active"] != false || m["combined_head_attached"] != true || m["peer_addr"] != "CUDA1" ||
		m["peer_reachable"] != true || m["layer_split"] != "0-47:CUDA0" || m["split_mode"] != "layer" || m["active_quant"] != "base+q8" ||
		string(caps) != `["prefill","decode","state_transfer","expert_mode","model_hash","state_shm","quant_swap","combined"]` {
		t.Fatalf("INFO %s", meta)
	}
	if keys, _ := json.Marshal(m["quant_keys"]); string(keys) != `["base","q8"]` {
		t.Fatalf("quant_keys %s", keys)
	}
}

func (b *quantBackend) LendWeights(context.Context) (iface.WeightRegistry, error) {
	return iface.WeightRegistry{}, iface.ErrNotImplemented
}

func (b *quantBackend) BindPeer(context.Context, iface.WeightRegistry) (iface.ExpertModeResult, error) {
	return iface.ExpertModeResult{}, iface.ErrNotImplemented
}
