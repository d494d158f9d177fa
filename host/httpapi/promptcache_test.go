package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

// metricValue is the value of the line of series ("name" or
// "name{labels}") in a /metrics text, -1 where there is none.
func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

func scrape(t *testing.T, h http.Handler) string {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	return rec.Body.String()
}

// TestPromptCacheOverHTTP: completions let the backend's prompt cache save
// an earlier completion's sequence and start from a cached one (over the
// mock, which keeps the llama plugin's cache): two conversations taking
// turns on one slot come back from it, /metrics shows it, and a slot whose
// sequence no completion left is neither saved nor replaced.
func TestPromptCacheOverHTTP(t *testing.T) {
	b := mock.New(nil)
	info, err := b.Load(context.Background(), iface.LoadRequest{NSlots: 1, Options: map[string]string{mock.OptCacheRAM: "16"}})
	if err != nil {
		t.Fatal(err)
	}
	// A sequence of no known holder, as the coordinator's would be.
	if _, err := b.Prefill(context.Background(), iface.PrefillRequest{Slot: 0, Tokens: []int32{'x', 'y', 'z'}}); err != nil {
		t.Fatal(err)
	}
	_, h := serve(t, b, info, nil)
	complete := func(prompt string) string {
		t.Helper()
		rec := post(h, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":4,"id_slot":0}`, prompt))
		if rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	a := "conversation A: " + strings.Repeat("about the cache ", 20)
	bb := "conversation B: " + strings.Repeat("something else ", 20)
	complete(a)
	if text := scrape(t, h); metricValue(t, text, "hydra_engine_prompt_cache_saves_total") != 0 ||
		metricValue(t, text, "hydra_engine_prompt_cache_budget_bytes") != 16<<20 {
		t.Fatalf("the sequence no completion left was saved, or no budget:\n%s", grep(text, "prompt_cache"))
	}
	for range 3 {
		a += " and A goes on"
		complete(a)
		bb += " and B goes on"
		complete(bb)
	}
	text := scrape(t, h)
	// A's second turn goes on in its slot; from B's first on, each turn
	// saves the other conversation as it leaves and restores its own (B's
	// first misses).
	hits, restores := metricValue(t, text, "hydra_engine_prompt_cache_hits_total"), metricValue(t, text, "hydra_engine_prompt_cache_restores_total")
	if hits != 4 || restores != 4 || metricValue(t, text, "hydra_engine_prompt_cache_misses_total") != 1 ||
		metricValue(t, text, "hydra_engine_prompt_cache_saves_total") != 5 ||
		metricValue(t, text, "hydra_engine_prompt_cache_entries") != 1 || metricValue(t, text, `hydra_engine_prompt_cache_failures_total{op="restore"}`) != 0 ||
		metricValue(t, text, "hydra_engine_prompt_cache_restored_bytes_total") <= 0 {
		t.Fatalf("after two conversations took turns:\n%s", grep(text, "prompt_cache"))
	}
	if reused := metricValue(t, text, "hydra_engine_prompt_tokens_reused_total"); reused < 4*float64(len(a)-3*len(" and A goes on")) {
		t.Fatalf("prompt tokens reused %v", reused)
	}
}

func grep(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Without a cache there are no prompt cache series.
func TestNoPromptCacheMetrics(t *testing.T) {
	_, h := newTestServer(t, 1)
	post(h, "/v1/completions", `{"prompt":"hi","max_tokens":1}`)
	if text := scrape(t, h); strings.Contains(text, "hydra_engine_prompt_cache_") {
		t.Fatalf("prompt cache series without a cache:\n%s", grep(text, "prompt_cache"))
	}
}
