//go:build llama

package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/transport"
)

// SWAP_QUANT and SET_EXPERT_MODE end to end: an engine on the llama.cpp
// plugin with the tests' MoE model at F16 and the same model at Q8_0 as
// quantisation q8, the CPU standing in for the combined mode's peer.

// swapModels writes the MoE model at F16 and at Q8_0.
func swapModels(t *testing.T) (f16, q8 string) {
	t.Helper()
	dir := t.TempDir()
	for _, m := range []struct {
		path *string
		w    gguf.WeightType
	}{{&f16, gguf.WeightF16}, {&q8, gguf.WeightQ8_0}} {
		c := gguf.TinyMoE()
		c.Type = m.w
		*m.path = filepath.Join(dir, "moe-"+m.w.String()+".gguf")
		if err := gguf.WriteFile(*m.path, c); err != nil {
			t.Fatal(err)
		}
	}
	return f16, q8
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// swapQuantPayload is SWAP_QUANT's [u16 key_len][key][pattern].
func swapQuantPayload(key, pattern string) []byte {
	return append(binary.LittleEndian.AppendUint16(nil, uint16(len(key))), key+pattern...)
}

// TestLlamaSwapQuant: INFO lists the quantisations; SWAP_QUANT over the
// wire swaps them, replying the reference's keys first, and every reply's
// model identity follows; a slot's state survives the swap byte for byte;
// bad requests change nothing. hydractl swap-quant and expert-mode speak
// the same ops.
func TestLlamaSwapQuant(t *testing.T) {
	plugin, _ := llamaSetup(t)
	f16, q8 := swapModels(t)
	e := startEngine(t, "--backend", plugin, "--model", f16, "--slots", "2", "--backend-opt", "n_threads=1",
		"--backend-opt", "n_ctx=512", "--backend-opt", "quant.q8="+q8, "--backend-opt", "combined_peer=CPU")
	c := client(t, e.tcp)

	info, _ := mustOK(t, c, transport.OpInfo, "", nil)
	caps, _ := info["capabilities"].([]any)
	if !slices.Contains(caps, any("quant_swap")) || !slices.Contains(caps, any("combined")) ||
		!slices.Equal(info["quant_keys"].([]any), []any{"base", "q8"}) || info["active_quant"] != "base" ||
		info["model_hash"] != sha256File(t, f16) || info["peer_addr"] != "CPU" || info["peer_reachable"] != true ||
		info["split_mode"] != "layer" || !strings.HasPrefix(info["layer_split"].(string), "0-") || info["mode"] != "solo" {
		t.Fatalf("INFO %v", info)
	}

	mustOK(t, c, transport.OpPrefill, "0", chat("Swap my weights, keep my cache."))
	_, before := mustOK(t, c, transport.OpStateGet, "0", nil)

	resp, _, err := c.Call(ctxT(t), transport.OpSwapQuant, "worker-7", swapQuantPayload("q8", ".*"))
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("SWAP_QUANT: %v %v %s", err, resp.Status, resp.Meta)
	}
	keys := []string{`{"success":true,"swapped":`, `,"bytes":`, `,"swap_ms":`, `,"kv_preserved":true,"quant_key":"q8","tensor_pattern":".*","active_quant":"q8","model_alias":"moe-f16","model_hash":"` + sha256File(t, q8) + `","model_path":"` + q8 + `"}`}
	at := 0
	for _, k := range keys {
		i := bytes.Index(resp.Meta[at:], []byte(k))
		if i < 0 {
			t.Fatalf("SWAP_QUANT meta %s lacks %s after byte %d", resp.Meta, k, at)
		}
		at += i + len(k)
	}
	_, after := mustOK(t, c, transport.OpStateGet, "0", nil)
	if !bytes.Equal(before, after) {
		t.Fatal("the slot's state changed with the swap")
	}
	meta, _ := mustOK(t, c, transport.OpStateMeta, "0", nil)
	pm, _ := mustOK(t, c, transport.OpPrefill, "1", chat("Who am I now?"))
	if meta["model_hash"] != sha256File(t, q8) || pm["model_hash"] != sha256File(t, q8) {
		t.Fatalf("identity after the swap: STATE_META %v, PREFILL %v", meta["model_hash"], pm["model_hash"])
	}

	for _, bad := range []struct {
		payload []byte
		status  transport.Status
		text    string
	}{
		{swapQuantPayload("q6_k", ".*"), transport.StatusError, "unknown quantisation key"},
		{swapQuantPayload("base", `blk\.99\.`), transport.StatusError, "matches none"},
		{[]byte{9, 0, 'q'}, transport.StatusError, "exceeds"},
	} {
		st, m, _ := call(t, c, transport.OpSwapQuant, "0", bad.payload)
		if st != bad.status || m["success"] != false || !strings.Contains(m["error"].(string), bad.text) {
			t.Errorf("SWAP_QUANT %q: %v %v", bad.payload, st, m)
		}
	}
	if m, _ := mustOK(t, c, transport.OpInfo, "0", nil); m["active_quant"] != "q8" || m["model_hash"] != sha256File(t, q8) {
		t.Fatalf("refused swaps changed INFO: %v", m)
	}

	m := hydractlMeta(t, "--addr", e.tcp, "swap-quant", "base", `blk\.[0-9]+\.ffn_(gate|up|down)_exps`)
	if m["swapped"] != float64(12) || m["active_quant"] != "base+q8" || m["model_hash"] == sha256File(t, q8) || m["model_hash"] == sha256File(t, f16) {
		t.Fatalf("hydractl swap-quant: %v", m)
	}
	if m := hydractlMeta(t, "--addr", e.tcp, "expert-mode", "combined"); m["mode"] != "combined" {
		t.Fatalf("hydractl expert-mode combined: %v", m)
	}
	if m, _ := mustOK(t, c, transport.OpInfo, "0", nil); m["mode"] != "combined" || m["combined_head_attached"] != true || m["solo_active"] != false {
		t.Fatalf("INFO in combined mode: %v", m)
	}
	mustOK(t, c, transport.OpDecode, "0", decodeJSON(4))
}

// hydractlMeta runs hydractl --json and returns the reply's meta.
func hydractlMeta(t *testing.T, args ...string) map[string]any {
	t.Helper()
	m, err := hydractlJSON(t, args...)
	meta, ok := m["meta"].(map[string]any)
	if err != nil || !ok {
		t.Fatalf("hydractl %q: %v, %v", args, m, err)
	}
	return meta
}
