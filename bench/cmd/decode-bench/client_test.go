package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A server that has no free slot answers 503; the client retries and the
// wait counts in the request's time to first token.
func TestDoRetriesWhileBusy(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			http.Error(w, `{"error":{"message":"all slots are busy"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, tok := range []string{"a", "b"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q,\"finish_reason\":null}]}\n\n", tok)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\"id_slot\":3}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	ep := &endpoint{base: srv.URL, model: "m", api: oursRaw, http: newHTTPClient()}
	t0 := time.Now()
	s := ep.do(context.Background(), t0, call{p: prompt{Tokens: []int32{1, 2, 3, 4}}, n: 2, slot: -1}, nil)
	if s.Err != "" {
		t.Fatal(s.Err)
	}
	if s.Busy != 2 || s.Tokens != 2 || s.Counted != "usage" || s.Text != "ab" || s.Slot != 3 || s.Prompt != 4 || s.Chunks != 2 {
		t.Errorf("%+v", s)
	}
	if s.ttft() < 2*busyRetry {
		t.Errorf("TTFT %v does not include the two waits for a slot", s.ttft())
	}
	if !(s.First <= s.Last && s.Last <= s.End) {
		t.Errorf("times out of order: %+v", s)
	}
}

func TestDoReportsHTTPErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"model 'x' not found"}`, http.StatusNotFound)
	}))
	defer srv.Close()
	ep := &endpoint{base: srv.URL, model: "x", api: ollamaRaw, http: newHTTPClient()}
	s := ep.do(context.Background(), time.Now(), call{p: prompt{Text: "hi"}, n: 2, slot: -1}, nil)
	if !strings.Contains(s.Err, "404") || !strings.Contains(s.Err, "not found") {
		t.Errorf("error %q", s.Err)
	}
}

// Without a server count the client counts messages with text.
func TestDoCountsChunksWithoutUsage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[{\"text\":\"y\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	ep := &endpoint{base: srv.URL, api: oursRaw, http: newHTTPClient()}
	s := ep.do(context.Background(), time.Now(), call{n: 2, slot: -1}, nil)
	if s.Err != "" || s.Tokens != 2 || s.Counted != "chunks" {
		t.Errorf("%+v", s)
	}
}

func TestRequestBodies(t *testing.T) {
	c := call{p: prompt{Text: "hello", Tokens: []int32{1, 7}}, n: 5, slot: 2}
	ours := oursRaw.body("m", c).(map[string]any)
	if fmt.Sprint(ours["prompt"]) != "[1 7]" || ours["max_tokens"] != 5 || ours["temperature"] != 0 || ours["id_slot"] != 2 {
		t.Errorf("ours: %v", ours)
	}
	ol := ollamaRaw.body("m", c).(map[string]any)
	opts := ol["options"].(map[string]any)
	if ol["prompt"] != "hello" || ol["raw"] != true || opts["num_predict"] != 5 || opts["repeat_penalty"] != 1 || opts["temperature"] != 0 {
		t.Errorf("ollama: %v", ol)
	}
	if _, ok := openAIChat.body("m", call{p: c.p, n: 5, slot: -1}).(map[string]any)["id_slot"]; ok {
		t.Error("id_slot sent for any slot")
	}
}
