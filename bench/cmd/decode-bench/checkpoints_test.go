package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// completeNative reads /completion's timings, and refuses a reply without
// prompt_n rather than counting it as 0.
func TestCompleteNative(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		if got["n_predict"] == float64(2) {
			w.Write([]byte(`{"content":"x"}`))
			return
		}
		w.Write([]byte(`{"content":"x","timings":{"prompt_n":4,"cache_n":116,"prompt_ms":1.5}}`))
	}))
	defer srv.Close()
	s, err := completeNative(context.Background(), srv.Client(), srv.URL, []int32{1, 2, 3}, 1)
	if err != nil || s.PromptN != 4 || s.CacheN != 116 || s.PromptMS != 1.5 || s.WallMS <= 0 {
		t.Fatalf("%+v %v", s, err)
	}
	if got["id_slot"] != float64(0) || got["cache_prompt"] != true || len(got["prompt"].([]any)) != 3 {
		t.Fatalf("request %v", got)
	}
	if _, err := completeNative(context.Background(), srv.Client(), srv.URL, []int32{1}, 2); err == nil || !strings.Contains(err.Error(), "prompt_n") {
		t.Fatalf("a reply without timings: %v", err)
	}
}

// The page's section: each case's counts and medians, ours beside
// llama-server, counts that differ between reps listed.
func TestWriteCheckpoints(t *testing.T) {
	r := &report{Checkpoints: &ckptRun{Reps: 2, Cases: []string{"A again"}, Sizes: []ckptSize{{Tokens: 32768, NCtx: 33280,
		Systems: []ckptSystem{
			{oneServer: oneServer{Name: "ours"}, Cases: map[string][]ckptSample{"A again": {{PromptN: 4, WallMS: 80}, {PromptN: 4, WallMS: 100}}}},
			{oneServer: oneServer{Name: "llama-server"}, Cases: map[string][]ckptSample{"A again": {{PromptN: 4, WallMS: 100}, {PromptN: 5, WallMS: 100}}}},
		}}}}}
	var b bytes.Buffer
	r.writeCheckpoints(func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) })
	if !strings.Contains(b.String(), "| A again | 4, 5 | 4 |") || !strings.Contains(b.String(), "0.90") {
		t.Fatalf("section:\n%s", b.String())
	}
}
