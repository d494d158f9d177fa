//go:build llama

package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestLlamaOpenAISDK runs tests/openai/client.mjs, the official OpenAI Node
// SDK, against the engine on the llama plugin with a random-weight Qwen3
// model carrying Qwen3's real tokenizer and chat template: a required tool
// call, its result and the next turn; a named call streamed and reassembled
// by the SDK; a json_schema reply parsed by the SDK; a tool_choice naming no
// tool raised as a 400 naming the field; the Responses API's plain and
// streamed replies and a tool round trip (checkResponses); and
// llama-server's native /completion (checkNative). It skips, saying what to
// install, only where node, the SDK (make openai-client) or the tokenizer
// (make tokenizers) is missing.
func TestLlamaOpenAISDK(t *testing.T) {
	out, base := runSDKClient(t, "OpenAI", "openai", "openai", "openai-client")
	checkResponses(t, out, base)
	checkNative(t, base) // llama-server's own /completion, on the same engine and tokenizer
	type msg struct {
		Content   *string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	type reply struct {
		FinishReason string `json:"finish_reason"`
		Message      msg    `json:"message"`
		Chunks       int    `json:"chunks"`
	}
	var got struct {
		Call, Next, Stream reply
		ResponseFormat     struct {
			FinishReason string `json:"finish_reason"`
			Parsed       *struct {
				Name *string  `json:"name"`
				N    *float64 `json:"n"`
			} `json:"parsed"`
		} `json:"response_format"`
		Bad struct {
			Status int    `json:"status"`
			Param  string `json:"param"`
		} `json:"bad"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client.mjs printed %s: %v", out, err)
	}
	for name, r := range map[string]reply{"call": got.Call, "stream": got.Stream} {
		if r.FinishReason != "tool_calls" || len(r.Message.ToolCalls) == 0 {
			t.Errorf("%s: finish %q, no tool call: %s", name, r.FinishReason, out)
			continue
		}
		tc := r.Message.ToolCalls[0]
		var args struct {
			City *string `json:"city"`
		}
		if tc.ID == "" || tc.Type != "function" || tc.Function.Name != "get_weather" || json.Unmarshal([]byte(tc.Function.Arguments), &args) != nil || args.City == nil {
			t.Errorf("%s: call %+v", name, tc)
		}
	}
	if got.Stream.Chunks < 3 {
		t.Errorf("the streamed call came in %d chunks", got.Stream.Chunks)
	}
	if got.Next.FinishReason == "" || len(got.Next.Message.ToolCalls) != 0 || got.Next.Message.Content == nil {
		t.Errorf("next turn: %+v", got.Next)
	}
	if p := got.ResponseFormat.Parsed; got.ResponseFormat.FinishReason != "stop" || p == nil || p.Name == nil || p.N == nil {
		t.Errorf("response_format: %s", out)
	}
	if got.Bad.Status != 400 || got.Bad.Param != "tool_choice" {
		t.Errorf("unknown tool_choice: %+v", got.Bad)
	}
	t.Logf("%s", out)

	// The backend's own refusals (a grammar it cannot parse, a schema
	// json-schema-to-grammar refuses) are 400s naming the fault, before any
	// reply byte, streamed or not, and leave the one slot free.
	for _, body := range []string{
		`{"messages":[{"role":"user","content":"x"}],"grammar":"root ::= thing"}`,
		`{"messages":[{"role":"user","content":"x"}],"stream":true,"grammar":"root ::= thing"}`,
		`{"prompt":"x","json_schema":{"type":"object","properties":{"a":{"$ref":"#/nowhere"}}}}`,
	} {
		path := "/v1/chat/completions"
		if strings.HasPrefix(body, `{"prompt"`) {
			path = "/v1/completions"
		}
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Error struct {
				Param string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if resp.StatusCode != 400 || !(strings.Contains(string(b), "thing") && e.Error.Param == "grammar" ||
			strings.Contains(string(b), "nowhere") && e.Error.Param == "json_schema") {
			t.Errorf("%s: %d %s", body, resp.StatusCode, b)
		}
	}
	resp, err := http.Post(base+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"grammar":"root ::= \"ok\""}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"ok"`) {
		t.Errorf("after the refusals, a grammar of \"ok\": %d %s", resp.StatusCode, b)
	}
}

// responseItem is an output item of a Response, as the SDK returned it.
type responseItem struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Role    string `json:"role"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// itemsOf are the items of type kind.
func itemsOf(items []responseItem, kind string) []responseItem {
	var out []responseItem
	for _, it := range items {
		if it.Type == kind {
			out = append(out, it)
		}
	}
	return out
}

// checkResponses judges client.mjs's Responses API scenarios: a plain reply
// and its output_text; the same streamed, the SDK's rebuilt text equal to
// it; a required call streamed, its arguments rebuilt, its
// function_call_output and the next turn; a hosted tool refused naming the
// field; and /v1/responses/input_tokens counting what the reply's usage did.
func checkResponses(t *testing.T, out []byte, base string) {
	t.Helper()
	type response struct {
		Status     string         `json:"status"`
		Output     []responseItem `json:"output"`
		OutputText string         `json:"output_text"`
		Snapshot   string         `json:"snapshot"`
		Events     []string       `json:"events"`
		Usage      struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	var got struct {
		Plain  response `json:"responses"`
		Stream response `json:"responses_stream"`
		Call   response `json:"responses_call"`
		Next   response `json:"responses_next"`
		Bad    struct {
			Status int    `json:"status"`
			Param  string `json:"param"`
		} `json:"responses_bad"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client.mjs printed %s: %v", out, err)
	}
	p := got.Plain
	msgs := itemsOf(p.Output, "message")
	if len(msgs) != 1 || msgs[0].Role != "assistant" || len(msgs[0].Content) != 1 || msgs[0].Content[0].Type != "output_text" ||
		msgs[0].Content[0].Text != p.OutputText || p.OutputText == "" || p.Status != "incomplete" && p.Status != "completed" {
		t.Errorf("plain response: %+v", p)
	}
	if u := p.Usage; u.InputTokens == 0 || u.OutputTokens == 0 || u.OutputTokens > 8 || u.TotalTokens != u.InputTokens+u.OutputTokens {
		t.Errorf("plain response's usage %+v", u)
	}
	s := got.Stream
	if n := len(s.Events); n < 6 || s.Events[0] != "response.created" || s.Events[1] != "response.in_progress" || s.Events[n-1] != "response."+p.Status {
		t.Errorf("stream events %v, want them to end in response.%s", s.Events, p.Status)
	}
	if sm := itemsOf(s.Output, "message"); s.Snapshot != p.OutputText || len(sm) != 1 || sm[0].Content[0].Text != p.OutputText {
		t.Errorf("streamed %q, rebuilt %+v; the same request whole said %q", s.Snapshot, s.Output, p.OutputText)
	}
	calls := itemsOf(got.Call.Output, "function_call")
	var args struct {
		City *string `json:"city"`
	}
	if got.Call.Status != "completed" || len(calls) == 0 || calls[0].Name != "get_weather" || !strings.HasPrefix(calls[0].CallID, "call_") ||
		!strings.HasPrefix(calls[0].ID, "fc_") || json.Unmarshal([]byte(calls[0].Arguments), &args) != nil || args.City == nil {
		t.Errorf("call: %+v", got.Call)
	} else if calls[0].Arguments != got.Call.Snapshot {
		t.Errorf("streamed arguments rebuilt as %q, the response says %q", got.Call.Snapshot, calls[0].Arguments)
	}
	if n := got.Next; n.Status == "" || len(itemsOf(n.Output, "function_call")) != 0 || len(itemsOf(n.Output, "message")) != 1 {
		t.Errorf("next turn: %+v", n)
	}
	if got.Bad.Status != 400 || got.Bad.Param != "tools[0].type" {
		t.Errorf("a hosted tool: %+v", got.Bad)
	}

	count := func(path, body string) int {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var n struct {
			InputTokens int    `json:"input_tokens"`
			Object      string `json:"object"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&n); err != nil || resp.StatusCode != 200 || n.Object != "response.input_tokens" {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, err)
		}
		return n.InputTokens
	}
	resp := count("/v1/responses/input_tokens", `{"instructions":"Be brief.","input":"Say hello."}`)
	chat := count("/v1/chat/completions/input_tokens", `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}`)
	if resp != chat || resp != p.Usage.InputTokens {
		t.Errorf("input_tokens %d, the chat's %d, the reply's usage %d", resp, chat, p.Usage.InputTokens)
	}
}
