//go:build llama

package tests

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
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

// qwen35moeQwen3 writes the nodes' architecture (a tiny qwen35moe) with
// Qwen3's real tokenizer and chat template; it skips without them.
func qwen35moeQwen3(t *testing.T) string {
	t.Helper()
	c := withQwen3Tokenizer(t, gguf.TinyQwen35MoE())
	model := filepath.Join(t.TempDir(), "qwen35moe-qwen3.gguf")
	if err := gguf.WriteFile(model, c); err != nil {
		t.Fatal(err)
	}
	return model
}

// promptEvaluated posts body to url and returns the reply's
// timings.prompt_n: the prompt tokens evaluated, as llama-server counts them.
func promptEvaluated(t *testing.T, url, body string) int {
	t.Helper()
	return completionTimings(t, url, body).PromptN
}

// timings are a /completion reply's, as llama-server names them.
type timings struct {
	PromptN    int `json:"prompt_n"`
	PredictedN int `json:"predicted_n"`
	DraftN     int `json:"draft_n"`
}

// completionTimings posts body to url and returns the reply's timings.
func completionTimings(t *testing.T, url, body string) timings {
	t.Helper()
	code, raw := postBody(t, url, body)
	var r struct {
		Timings *timings `json:"timings"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || code != 200 || r.Timings == nil {
		t.Fatalf("POST %s: %d %.400s (%v)", url, code, raw, err)
	}
	return *r.Timings
}

// TestLlamaCheckpointsAsLlamaServer: ours in llama-server mode and
// llama.cpp's llama-server from the same tree, one slot each, the same
// model file (the nodes' hybrid architecture, Qwen3's tokenizer and
// template), the same requests: the prompt tokens each evaluates
// (timings.prompt_n) are equal in the three cases (prompts of token
// ids on /completion: A of 120 and 4 generated, then A + 64, A again, A cut
// 10 before its end + 64; n_ubatch 16, so checkpoints at N − 20 and N − 4)
// and in every turn of an agent's conversation on /v1/chat/completions
// (tool calls and results, Qwen3's template dropping earlier turns'
// reasoning when the user speaks again). The counts the rules give alone are
// TestCheckpointCases' and TestCheckpointAgentTurns' (plugin tests, which run
// without llama-server).
func TestLlamaCheckpointsAsLlamaServer(t *testing.T) {
	model := qwen35moeQwen3(t)
	ref := referenceServer(t)
	llamaSetup(t)
	args := []string{"--model", model, "--parallel", "1", "--ctx-size", "4096", "--threads", "1", "--threads-batch", "1",
		"--batch-size", "64", "--ubatch-size", "16", "--cache-ram", "0", "--jinja"}
	op, rp := freePort(t), freePort(t)
	startLlamaServer(t, op, append([]string{"--host", "127.0.0.1", "--port", fmt.Sprint(op)}, args...))
	startReference(t, ref, rp, args)
	p := pair{fmt.Sprintf("http://127.0.0.1:%d", op), fmt.Sprintf("http://127.0.0.1:%d", rp)}
	both := func(path, body string) (ours, theirs int) {
		return promptEvaluated(t, p.ours+path, body), promptEvaluated(t, p.ref+path, body)
	}

	ids := func(n, seed int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(1000 + (seed+i*7)%5000)
		}
		return out
	}
	completion := func(toks []int32) string {
		b, _ := json.Marshal(map[string]any{"prompt": toks, "n_predict": 4, "temperature": 0, "cache_prompt": true})
		return string(b)
	}
	for i, c := range []struct {
		name string
		then func(a []int32) []int32
		want int
	}{
		{"A + 64", func(a []int32) []int32 { return append(slices.Clone(a), ids(64, 99)...) }, 68},
		{"A again", func(a []int32) []int32 { return a }, 4},
		{"A cut 10 + 64", func(a []int32) []int32 { return append(slices.Clone(a[:110]), ids(64, 99)...) }, 74},
	} {
		a := ids(120, 17*i)
		if ours, theirs := both("/completion", completion(a)); ours != 120 || theirs != 120 {
			t.Fatalf("%s: prompt A evaluated %d here, %d by llama-server; want 120", c.name, ours, theirs)
		}
		ours, theirs := both("/completion", completion(c.then(a)))
		if ours != theirs || ours != c.want {
			t.Errorf("%s: evaluated %d here, %d by llama-server; the rules give %d", c.name, ours, theirs, c.want)
		}
		t.Logf("%s: %d evaluated here, %d by llama-server", c.name, ours, theirs)
	}

	tools := `[{"type":"function","function":{"name":"read_file","description":"Read a file.",` +
		`"parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`
	msgs := []map[string]any{
		{"role": "system", "content": "You are a coding agent. Read files with read_file and answer briefly."},
		{"role": "user", "content": "Why does the build fail on the CI machine but not here?"},
	}
	var evaluated []int
	for turn := range 9 {
		body, _ := json.Marshal(map[string]any{"messages": msgs, "tools": json.RawMessage(tools), "max_tokens": 6, "temperature": 0})
		ours, theirs := both("/v1/chat/completions", string(body))
		evaluated = append(evaluated, ours)
		if ours != theirs {
			t.Errorf("turn %d: evaluated %d prompt tokens here, %d by llama-server", turn, ours, theirs)
		}
		n := turn + 1
		if turn%3 == 2 {
			msgs = append(msgs, map[string]any{"role": "assistant", "reasoning_content": "The files say enough.", "content": fmt.Sprintf("Answer %d.", n)},
				map[string]any{"role": "user", "content": fmt.Sprintf("Thanks. Now question %d: what about the tests?", n)})
			continue
		}
		id := fmt.Sprintf("call_%d", n)
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "", "reasoning_content": fmt.Sprintf("I should look at file %d first.", n),
			"tool_calls": []map[string]any{{"id": id, "type": "function", "function": map[string]any{"name": "read_file", "arguments": fmt.Sprintf(`{"path": "src/f%d.go"}`, n)}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": strings.Repeat(fmt.Sprintf("line %d of the file; ", n), 6)})
	}
	t.Logf("agent turns: prompt tokens evaluated %v, as llama-server", evaluated)
}
