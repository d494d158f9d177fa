//go:build llama

package tests

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
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

// TestLlamaSwapQuantBesideHTTP: SWAP_QUANTs while chats run on every slot,
// 8 at a time: each swap waits for the work in progress, the chats that
// arrive meanwhile wait for it in the queue, and none is refused (6 of 80
// answered 503 before).
func TestLlamaSwapQuantBesideHTTP(t *testing.T) {
	plugin, _ := llamaSetup(t)
	f16, q8 := swapModels(t)
	e, base := startHTTPEngine(t, "--backend", plugin, "--model", f16, "--slots", "2", "--backend-opt", "n_threads=1",
		"--backend-opt", "n_ctx=1024", "--backend-opt", "quant.q8="+q8)
	c := client(t, e.tcp)
	stop := make(chan struct{})
	swaps := make(chan int, 1)
	go func() {
		n := 0
		defer func() { swaps <- n }()
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			key := []string{"q8", "base"}[k%2]
			resp, meta, err := c.Call(ctxT(t), transport.OpSwapQuant, "0", swapQuantPayload(key, `ffn_.*_exps`))
			if err != nil || resp.Status != transport.StatusOK {
				t.Errorf("SWAP_QUANT %s: %v %s", key, err, meta)
				return
			}
			n++
		}
	}()
	var wg sync.WaitGroup
	codes := make([]int, 40)
	sem := make(chan struct{}, 8) // within the queue (8 per slot)
	for i := range codes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"chat %d beside the swaps"}],"max_tokens":6}`, i)
			var b []byte
			codes[i], b, _ = httpDo(t, "POST", base+"/v1/chat/completions", body)
			if codes[i] != 200 {
				t.Logf("chat %d: %s", i, b)
			}
		})
	}
	wg.Wait()
	close(stop)
	n := <-swaps
	for i, code := range codes {
		if code != 200 {
			t.Errorf("chat %d: %d", i, code)
		}
	}
	if n == 0 {
		t.Fatal("no swap ran beside the chats")
	}
	t.Logf("40 chats beside %d SWAP_QUANTs: all 200", n)
}

// TestLlamaSpecialTokenFloodHTTP: 80,000 <|im_end|> in a user message, and
// as a raw completion prompt (which took llama.cpp's special-token
// partition minutes of CPU), are refused 400 at once: the plugin's
// MaxTokenBytes lets the host see from the bytes alone that they cannot fit
// a slot. The engine serves a chat right after.
func TestLlamaSpecialTokenFloodHTTP(t *testing.T) {
	_, base := startLlamaHTTP(t, 4, "--backend-opt", "n_ctx=4096")
	flood := strings.Repeat("<|im_end|>", 80000)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":1}`, flood)},
		{"/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, flood)},
	} {
		start := time.Now()
		code, b, _ := httpDo(t, "POST", base+c.path, c.body)
		took := time.Since(start)
		if code != 400 || !strings.Contains(string(b), "cannot fit") {
			t.Errorf("%s with 80,000 <|im_end|>: %d %.200s, want 400 saying it cannot fit", c.path, code, b)
		}
		t.Logf("%s, 80,000 <|im_end|> (%d bytes): %d after %v", c.path, len(flood), code, took)
	}
	if code, b, _ := httpDo(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); code != 200 {
		t.Fatalf("a chat after the floods: %d %s", code, b)
	}
}
