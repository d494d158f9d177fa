package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// TestPromptsEvictIdleHTTPSequences: three long prompts one after another
// over 4 slots sharing 4096 cells: each after the first evicts the idle
// sequence an earlier one left instead of failing, and the evictions are
// counted.
func TestPromptsEvictIdleHTTPSequences(t *testing.T) {
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 4,
		Options: map[string]string{mock.OptKVUnified: "true", mock.OptNCtx: "4096"}})
	if err != nil {
		t.Fatal(err)
	}
	s, h := serve(t, b, info, nil)
	for i := range 3 {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":8}`, strings.Repeat(fmt.Sprintf("prompt %d ", i), 245))
		if rec := post(h, "/v1/chat/completions", body); rec.Code != 200 {
			t.Fatalf("prompt %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if seqs, cells := s.Stats().KVEvictions(); seqs != 2 || cells < 4000 {
		t.Errorf("evictions: %d sequences, %d cells; want 2 of ~2200 cells", seqs, cells)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), "hydra_engine_kv_evictions_total 2") {
		t.Errorf("/metrics does not count the evictions:\n%s", grepLines(rec.Body.String(), "kv_evict"))
	}
	// A prompt that no eviction makes fit is the client's error.
	big := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":8}`, strings.Repeat("x", 5000))
	if rec := post(h, "/v1/chat/completions", big); rec.Code != 400 {
		t.Errorf("a prompt larger than the cache: %d %s", rec.Code, rec.Body)
	}
}

// TestManyConversationsShareTheCache: 32 conversations of mixed lengths,
// 8 at a time, over 4 slots sharing 4096 cells: none is refused.
func TestManyConversationsShareTheCache(t *testing.T) {
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 4,
		Options: map[string]string{mock.OptKVUnified: "true", mock.OptNCtx: "4096"}})
	if err != nil {
		t.Fatal(err)
	}
	_, h := serve(t, b, info, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	bodies := make([]string, 32)
	for i := range bodies {
		n := 50 + rng.IntN(1500)
		bodies[i] = fmt.Sprintf(`{"messages":[{"role":"user","content":%q}],"max_tokens":%d,"ignore_eos":true}`,
			strings.Repeat(string(rune('a'+i%26)), n), 20+rng.IntN(200))
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	codes := make([]int, len(bodies))
	for i, body := range bodies {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			rec := post(h, "/v1/chat/completions", body)
			codes[i] = rec.Code
			if rec.Code != 200 {
				t.Logf("conversation %d: %s", i, rec.Body)
			}
			var r struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if rec.Code == 200 && (json.Unmarshal(rec.Body.Bytes(), &r) != nil || r.Choices[0].FinishReason != "length") {
				t.Errorf("conversation %d: %s", i, rec.Body)
			}
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("conversation %d: %d %s", i, c, bodies[i][:40])
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
