package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

// The conversation: each turn's messages are the last turn's and what was
// added (a call and its result, or an answer and a user message every
// third turn); another seed is another repository.
func TestAgentConversation(t *testing.T) {
	conv := agentConversation(1, 50, 7)
	if len(conv) != 7 || len(conv[0]) != 2 {
		t.Fatalf("%d turns, the first of %d messages", len(conv), len(conv[0]))
	}
	for i := 1; i < len(conv); i++ {
		prev, cur := conv[i-1], conv[i]
		if len(cur) != len(prev)+2 || !reflect.DeepEqual(cur[:len(prev)], prev) {
			t.Fatalf("turn %d does not extend turn %d", i, i-1)
		}
		added := cur[len(cur)-1]["role"]
		if want := map[bool]string{true: "user", false: "tool"}[i%3 == 0]; added != want {
			t.Errorf("turn %d adds a %v message, want %s", i, added, want)
		}
	}
	if reflect.DeepEqual(agentConversation(2, 50, 1), conv[:1]) {
		t.Error("another seed gave the same system prompt")
	}
}

// chatTurn sends the messages with the tool for one token and reads usage
// and timings; a reply without prompt_n is refused, not counted as 0.
func TestChatTurn(t *testing.T) {
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		if len(got["messages"].([]any)) == 1 {
			w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":9}}`))
			return
		}
		w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":120},"timings":{"prompt_n":20,"cache_n":100,"prompt_ms":2.5}}`))
	}))
	defer srv.Close()
	conv := agentConversation(1, 20, 1)[0]
	s, err := chatTurn(context.Background(), srv.Client(), srv.URL, conv)
	if err != nil || s.PromptTokens != 120 || s.PromptN != 20 || s.CacheN != 100 || s.PromptMS != 2.5 || s.WallMS <= 0 {
		t.Fatalf("%+v %v", s, err)
	}
	if got["max_tokens"] != float64(1) || got["tools"] == nil || len(got["messages"].([]any)) != 2 {
		t.Fatalf("request %v", got)
	}
	if _, err := chatTurn(context.Background(), srv.Client(), srv.URL, conv[:1]); err == nil || !strings.Contains(err.Error(), "prompt_n") {
		t.Fatalf("a reply without timings: %v", err)
	}
}

// The page's section: a row a turn, ours beside llama-server.
func TestWriteAgent(t *testing.T) {
	reply := func(n, evaluated int, ms float64) agentReply {
		return agentReply{ckptSample: ckptSample{PromptN: evaluated, WallMS: ms}, PromptTokens: n}
	}
	r := &report{Agent: &agentRun{Reps: 1, Turns: 2, Sizes: []agentSize{{Tokens: 32768, NCtx: 40960, Systems: []agentSystem{
		{oneServer: oneServer{Name: "ours"}, Turns: [][]agentReply{{reply(32800, 32800, 3000)}, {reply(33100, 300, 90)}}},
		{oneServer: oneServer{Name: "llama-server"}, Turns: [][]agentReply{{reply(32800, 32800, 3100)}, {reply(33100, 300, 100)}}},
	}}}}}
	var b bytes.Buffer
	r.writeAgent(func(f string, a ...any) { fmt.Fprintf(&b, f+"\n", a...) })
	if !strings.Contains(b.String(), "| 2 | 33100 | 300 | 300 | 100.0 | 90.0 | 0.90 |") {
		t.Fatalf("section:\n%s", b.String())
	}
}
