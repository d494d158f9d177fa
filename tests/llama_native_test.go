//go:build llama

package tests

import (
	"bufio"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// nativeReply is a /completion reply or stream event.
type nativeReply struct {
	Content         string  `json:"content"`
	Tokens          []int32 `json:"tokens"`
	Stop            bool    `json:"stop"`
	TokensPredicted int     `json:"tokens_predicted"`
	TokensEvaluated int     `json:"tokens_evaluated"`
	Prompt          string  `json:"prompt"`
	Probs           []struct {
		ID          int32 `json:"id"`
		TopLogprobs []struct {
			ID int32 `json:"id"`
		} `json:"top_logprobs"`
	} `json:"completion_probabilities"`
}

// checkNative runs llama-server's native /completion on an engine whose
// model has a real tokenizer: a prompt of text and a token id mixed is
// tokenized piece by piece and echoed as its tokens' text; greedy, the
// sampled tokens are each position's likeliest alternative; the stream
// carries the same text and tokens, a chunk each, and no [DONE].
func checkNative(t *testing.T, base string) {
	t.Helper()
	postJSON := func(path, body string) *http.Response {
		t.Helper()
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			resp.Body.Close()
			t.Fatalf("%s %s: %d", path, body, resp.StatusCode)
		}
		return resp
	}
	tokens := func(text string) []int32 {
		t.Helper()
		resp := postJSON("/tokenize", `{"content":`+jsonString(text)+`,"add_special":true}`)
		defer resp.Body.Close()
		var r struct {
			Tokens []int32 `json:"tokens"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Tokens) == 0 {
			t.Fatalf("tokenize %q: %v %v", text, r.Tokens, err)
		}
		return r.Tokens
	}
	hello, comma, world := tokens("Hello"), tokens(","), tokens(" world")
	body := `{"prompt":["Hello",` + jsonString(comma[0]) + `," world"],"n_predict":4,"n_probs":2,"return_tokens":true,"temperature":0`
	resp := postJSON("/completion", body+`}`)
	var r nativeReply
	err := json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if err != nil || r.TokensEvaluated != len(hello)+1+len(world) || r.Prompt != "Hello, world" || !r.Stop ||
		r.TokensPredicted == 0 || len(r.Tokens) != r.TokensPredicted || len(r.Probs) != len(r.Tokens) {
		t.Fatalf("mixed prompt: %+v %v", r, err)
	}
	for i, p := range r.Probs {
		if p.ID != r.Tokens[i] || len(p.TopLogprobs) != 2 || p.TopLogprobs[0].ID != p.ID {
			t.Errorf("position %d of %v: %+v", i, r.Tokens, p)
		}
	}

	resp = postJSON("/completion", body+`,"stream":true}`)
	defer resp.Body.Close()
	var content strings.Builder
	var toks []int32
	var last nativeReply
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if sc.Text() == "" {
			continue
		}
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || d == "[DONE]" || last.Stop {
			t.Fatalf("a line %q in the native stream", sc.Text())
		}
		var ev nativeReply
		if err := json.Unmarshal([]byte(d), &ev); err != nil {
			t.Fatal(err)
		}
		last = ev
		content.WriteString(last.Content)
		toks = append(toks, last.Tokens...)
	}
	if !last.Stop || content.String() != r.Content || !reflect.DeepEqual(toks, r.Tokens) {
		t.Errorf("streamed %q %v (last %+v), the whole reply %q %v", content.String(), toks, last, r.Content, r.Tokens)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
