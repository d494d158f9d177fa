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
// tool raised as a 400 naming the field. It skips, saying what to install,
// only where node, the SDK (make openai-client) or the tokenizer (make
// tokenizers) is missing.
func TestLlamaOpenAISDK(t *testing.T) {
	out, base := runSDKClient(t, "OpenAI", "openai", "openai", "openai-client")
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
