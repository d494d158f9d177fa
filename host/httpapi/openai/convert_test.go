package openai

import (
	"errors"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// TestConvert: a chat or text completion body becomes the completion it
// runs as, over the engine's defaults, or a refusal whose status, message
// and param name what is wrong.
func TestConvert(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", NCtx: 100, NVocab: 50}
	def := iface.SamplerParams{Temperature: 0.5, TopK: 7}
	for _, c := range []struct {
		name  string
		chat  bool
		body  string
		check func(request.Completion) bool
	}{{
		name: "chat",
		chat: true,
		body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},` +
			`"max_completion_tokens":4,"logprobs":true,"top_logprobs":2,"stop":"END","seed":3}`,
		check: func(c request.Completion) bool {
			return c.Chat && c.Model == "m" && c.Stream && c.IncludeUsage && c.NPredict == 4 && c.Logprobs && c.NProbs == 2 &&
				reflect.DeepEqual(c.Stops, []string{"END"}) && c.Sampler.Seed == 3 && c.Sampler.Temperature == 0.5 &&
				len(c.Prefill.Messages) == 1 && c.Prefill.Messages[0].Content == "hi" && c.Slot == -1 && !c.Parsed && c.Output == nil
		},
	}, {
		name: "text of token ids",
		body: `{"prompt":[1,2,3],"max_tokens":2,"logprobs":3,"id_slot":1,"n_keep":-1,"temperature":0}`,
		check: func(c request.Completion) bool {
			return !c.Chat && reflect.DeepEqual(c.Prefill.Tokens, []int32{1, 2, 3}) && c.NPredict == 2 && c.Logprobs && c.NProbs == 3 &&
				c.Slot == 1 && c.NKeep == -1 && c.Sampler.Temperature == 0 && c.Sampler.TopK == 7 && !c.IncludeUsage
		},
	}, {
		name: "no limit: the engine's",
		body: `{"prompt":"a"}`,
		check: func(c request.Completion) bool {
			return c.Prefill.Text == "a" && c.NPredict == -1 && !c.Logprobs && c.Stops == nil
		},
	}} {
		got, err := Convert([]byte(c.body), c.chat, def, -1, info)
		if err != nil || !c.check(got) {
			t.Errorf("%s: %+v %v", c.name, got, err)
		}
	}

	for _, c := range []struct {
		chat   bool
		body   string
		status int
		err    string
		param  any
	}{
		{false, `[1]`, 400, "request body must be a JSON object, got an array", nil},
		{false, `{}`, 400, "prompt is required", "prompt"},
		{false, `{"prompt":""}`, 400, "prompt is empty", "prompt"},
		{false, `{"prompt":["a","b"]}`, 400, "prompt batches of 2 are not supported: send one prompt per request", "prompt"},
		{false, `{"prompt":"a","n":2}`, 400, "n must be 1: this engine returns one choice", "n"},
		{false, `{"prompt":"a","temperature":"hot"}`, 400, "field temperature: expected a number, got a string", "temperature"},
		{false, `{"prompt":"a","max_tokens":-2}`, 400, "max_tokens must be -1 (no limit) or in [0, 2147483647], got -2", "max_tokens"},
		{false, `{"prompt":"a","stop":["1","2","3","4","5"]}`, 400, "stop takes at most 4 strings, got 5", "stop"},
		{false, `{"prompt":"a","logit_bias":{"x":1}}`, 400, `logit_bias: key "x" is not a token id`, "logit_bias"},
		{false, `{"prompt":"a","logprobs":21}`, 400, "logprobs must be in [0, 20], got 21", "logprobs"},
		{false, `{"prompt":"a","id_slot":-5}`, 400, "id_slot -5 is not a slot id", "id_slot"},
		{true, `{"messages":"hi"}`, 400, "field messages: expected an array, got a string", "messages"},
		{true, `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}}`, 501,
			`the mock backend cannot constrain or parse a reply (tools with tool_choice other than "none", response_format, json_schema, grammar)`, nil},
	} {
		_, err := Convert([]byte(c.body), c.chat, def, -1, info)
		var e *run.Error
		if !errors.As(err, &e) || e.Status != c.status || e.Msg != c.err || e.Param != c.param {
			t.Errorf("%s: %#v, want %d %q (param %v)", c.body, err, c.status, c.err, c.param)
		}
	}
}
