//go:build llama

package tests

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// The second round of outside attacks on the llama backend (docs/
// reliability.md's attack table), with the tiny model, n_ctx 4096 shared by
// 4 slots, as the attack ran them.

// startLlamaHTTP starts an engine on the llama plugin with HTTP.
func startLlamaHTTP(t *testing.T, slots int, extra ...string) (*engine, string) {
	t.Helper()
	plugin, model := llamaSetup(t)
	args := []string{"--backend", plugin, "--model", model, "--slots", fmt.Sprint(slots), "--backend-opt", "n_threads=1"}
	return startHTTPEngine(t, append(args, extra...)...)
}

// TestLlamaSharedCacheEvictsIdleHTTP: three different ~2,200-character chat
// prompts one after another each get their reply: the later ones evict the
// idle sequences the earlier ones left (they answered 400 "needs 1928 KV
// cells, 243 free" before), and the evictions are counted.
func TestLlamaSharedCacheEvictsIdleHTTP(t *testing.T) {
	_, base := startLlamaHTTP(t, 4, "--backend-opt", "n_ctx=4096")
	for i := range 3 {
		words := make([]string, 0, 400)
		for k := 0; len(strings.Join(words, " ")) < 2200; k++ {
			words = append(words, fmt.Sprintf("w%d_%d", i, k))
		}
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":4}`, strings.Join(words, " "))
		if code, b, _ := httpDo(t, "POST", base+"/v1/chat/completions", body); code != 200 {
			t.Fatalf("prompt %d: %d %s", i, code, b)
		}
	}
	m := metricsOf(t, base)
	if m["hydra_engine_kv_evictions_total"] < 1 {
		t.Errorf("no eviction counted: %v", m["hydra_engine_kv_evictions_total"])
	}
	t.Logf("3 prompts of ~2,200 characters over n_ctx 4096: all answered, %v idle sequences (%v cells) evicted",
		m["hydra_engine_kv_evictions_total"], m["hydra_engine_kv_evicted_cells_total"])
}

// TestLlamaManyConversationsShareTheCache: 32 conversations of mixed
// lengths, 8 at a time, over 4 slots sharing 2048 cells, which four of them
// at once overfill: none gets a 4xx.
func TestLlamaManyConversationsShareTheCache(t *testing.T) {
	_, base := startLlamaHTTP(t, 4, "--backend-opt", "n_ctx=2048")
	rng := rand.New(rand.NewPCG(3, 4))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range 32 {
		n := 100 + rng.IntN(1000)
		words := make([]string, n/6)
		for k := range words {
			words[k] = fmt.Sprintf("c%dw%d", i, k)
		}
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d}`, strings.Join(words, " "), 4+rng.IntN(24))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if code, b, _ := httpDo(t, "POST", base+"/v1/chat/completions", body); code != 200 {
				t.Errorf("conversation %d: %d %s", i, code, b)
			}
		})
	}
	wg.Wait()
	m := metricsOf(t, base)
	if m["hydra_engine_kv_evictions_total"] < 1 {
		t.Errorf("no eviction: the conversations did not contend for the cache")
	}
	t.Logf("32 conversations, 8 at a time, over n_ctx 2048: no 4xx; %v idle sequences evicted", m["hydra_engine_kv_evictions_total"])
}
