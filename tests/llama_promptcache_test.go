//go:build llama

package tests

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/transport"
)

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatTurn sends a conversation's messages and returns the reply.
func chatTurn(t *testing.T, base string, msgs []chatMsg) string {
	t.Helper()
	body, err := json.Marshal(map[string]any{"messages": msgs, "max_tokens": 6, "temperature": 0})
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Choices []struct {
			Message chatMsg `json:"message"`
		} `json:"choices"`
	}
	httpJSON(t, "POST", base+"/v1/chat/completions", string(body), 200, &r)
	if len(r.Choices) != 1 {
		t.Fatalf("reply %+v", r)
	}
	return r.Choices[0].Message.Content
}

// TestLlamaPromptCache: two HTTP conversations taking turns on the one slot
// HTTP may use (the other holds the coordinator's sequence) come back from
// the host-memory prompt cache (cache_ram) each turn, /metrics says so, and
// they answer what an engine without the cache answers, which evaluates
// each turn's prompt in full; the coordinator's sequence is never saved or
// touched.
func TestLlamaPromptCache(t *testing.T) {
	type run struct {
		replies []string
		metrics map[string]float64
	}
	conversation := func(base string) run {
		convs := [][]chatMsg{{{Role: "user", Content: "Tell me about cats."}}, {{Role: "user", Content: "Now dogs, please."}}}
		follow := []string{"And more?", "Why so?"}
		var r run
		for turn := range 2 {
			for c := range convs {
				reply := chatTurn(t, base, convs[c])
				r.replies = append(r.replies, reply)
				convs[c] = append(convs[c], chatMsg{Role: "assistant", Content: reply}, chatMsg{Role: "user", Content: follow[turn]})
			}
		}
		r.metrics = metricsOf(t, base)
		return r
	}
	// An engine whose slot 0 holds the coordinator's sequence.
	start := func(extra ...string) (*transport.Client, string) {
		e, base := startLlamaHTTP(t, 2, append([]string{"--backend-opt", "n_ctx=2048"}, extra...)...)
		c := client(t, e.tcp)
		mustOK(t, c, transport.OpPrefill, "0", chat("The coordinator's own sequence, which HTTP leaves alone."))
		return c, base
	}
	c, base := start("--backend-opt", "cache_ram=64")
	_, before := getState(t, c, "0")
	with := conversation(base)
	if _, after := getState(t, c, "0"); !bytes.Equal(after, before) {
		t.Fatal("the coordinator's sequence in slot 0 changed while HTTP conversations came and went")
	}
	m := with.metrics
	// Slot 1 empty for A's first turn, B's first saves A (a miss); from
	// then on each turn saves the other conversation and restores its own.
	for name, want := range map[string]float64{
		"hydra_engine_prompt_cache_hits_total": 2, "hydra_engine_prompt_cache_misses_total": 2,
		"hydra_engine_prompt_cache_saves_total": 3, "hydra_engine_prompt_cache_restores_total": 2,
		"hydra_engine_prompt_cache_entries": 1, `hydra_engine_prompt_cache_failures_total{op="save"}`: 0,
		`hydra_engine_prompt_cache_failures_total{op="restore"}`: 0, "hydra_engine_prompt_cache_budget_bytes": 64 << 20,
	} {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	if m["hydra_engine_prompt_cache_restored_bytes_total"] <= 0 || m["hydra_engine_prompt_cache_restore_seconds_total"] <= 0 ||
		m["hydra_engine_prompt_cache_bytes"] <= 0 || m["hydra_engine_prompt_tokens_reused_total"] < 20 {
		t.Errorf("prompt cache metrics %v, reused tokens %v", grepMetrics(m, "prompt_cache"), m["hydra_engine_prompt_tokens_reused_total"])
	}
	t.Logf("restores: %.0f bytes in %.4f s", m["hydra_engine_prompt_cache_restored_bytes_total"], m["hydra_engine_prompt_cache_restore_seconds_total"])

	_, plainBase := start()
	without := conversation(plainBase)
	for i, r := range with.replies {
		if r == "" {
			t.Errorf("reply %d is empty: nothing to compare", i)
		}
	}
	if strings.Join(with.replies, "|") != strings.Join(without.replies, "|") {
		t.Errorf("with the cache the conversations answered\n%q\nwithout it\n%q", with.replies, without.replies)
	}
	if got := grepMetrics(without.metrics, "prompt_cache"); len(got) != 0 {
		t.Errorf("an engine without cache_ram serves %v", got)
	}
}
