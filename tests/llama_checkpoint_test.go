//go:build llama

package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/transport"
)

// TestLlamaCheckpointMoves: on the nodes' hybrid architecture (a tiny
// qwen35moe), a slot that evaluated a prompt of token ids and decoded holds
// context checkpoints (INFO says so); its STATE_GET blob carries the newest
// in the reference engine's layout; STATE_PUT into another engine keeps it
// (the reply says "kept"), and the same prompt there resumes from it, as on
// the source, evaluating its last 4 tokens, and decodes the same tokens.
func TestLlamaCheckpointMoves(t *testing.T) {
	plugin, _ := llamaSetup(t)
	model := filepath.Join(t.TempDir(), "qwen35moe.gguf")
	if err := gguf.WriteFile(model, gguf.TinyQwen35MoE()); err != nil {
		t.Fatal(err)
	}
	args := []string{"--backend", plugin, "--model", model, "--slots", "2", "--backend-opt", "n_threads=1",
		"--backend-opt", "n_ctx=2048", "--backend-opt", "n_batch=64", "--backend-opt", "n_ubatch=16"}
	e1, e2 := startEngine(t, args...), startEngine(t, args...)
	c1, c2 := client(t, e1.tcp), client(t, e2.tcp)
	const n = 120
	prompt := make([]byte, 0, 4*n)
	for i := range n {
		prompt = binary.LittleEndian.AppendUint32(prompt, uint32(100+(i*7)%300))
	}
	mustOK(t, c1, transport.OpPrefill, "0", prompt)
	decodeIDs(t, c1, "0", 4)
	info, _ := mustOK(t, c1, transport.OpInfo, "0", nil)
	if num(t, info, "ctx_checkpoints") != 32 || num(t, info, "checkpoints_held") != 2 || num(t, info, "checkpoint_bytes") <= 0 {
		t.Fatalf("INFO %v", info)
	}
	_, blob := getState(t, c1, "0")
	h, err := transport.ReadBlobHeader(bytes.NewReader(blob), int64(len(blob)), 0)
	if err != nil || h.Checkpoint == nil || h.Checkpoint.NTokens != n-4 || h.Checkpoint.PosMax != n-5 || len(h.Checkpoint.Draft) != 0 {
		t.Fatalf("STATE_GET's checkpoint %+v, %v", h.Checkpoint, err)
	}
	if pm, _ := mustOK(t, c2, transport.OpStatePut, "1", blob); pm["checkpoint"] != "kept" {
		t.Fatalf("STATE_PUT %v", pm)
	}
	restored := fmt.Sprintf("kept=%d", n-4)
	for _, side := range []struct {
		name string
		e    *engine
		c    *transport.Client
		slot string
	}{{"source", e1, c1, "0"}, {"destination", e2, c2, "1"}} {
		mustOK(t, side.c, transport.OpPrefill, side.slot, prompt)
		if !strings.Contains(side.e.logs.String(), restored) {
			t.Errorf("%s: the same prompt did not resume from its checkpoint (no %q in the log)", side.name, restored)
		}
	}
	want, _ := decodeIDs(t, c1, "0", 12)
	if got, _ := decodeIDs(t, c2, "1", 12); !slices.Equal(got, want) {
		t.Fatalf("the destination decoded %v, the source %v", got, want)
	}
}
