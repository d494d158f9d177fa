package request

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

func TestParse(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", NCtx: 100, NVocab: 50}
	def := iface.SamplerParams{Temperature: 0.5, TopK: 7}
	parse := func(body string, chat bool) (Completion, error) {
		return Parse([]byte(body), chat, def, -1, info)
	}
	c, err := parse(`{"prompt":"AB","max_tokens":3,"n_predict":5,"top_k":2,"seed":9,"stop":["x",""],"id_slot":-1}`, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.Prefill.Text != "AB" || c.Prefill.Tokens != nil {
		t.Errorf("a text prompt goes to the backend as text: %+v", c.Prefill)
	}
	if c.NPredict != 5 || c.Sampler.TopK != 2 || c.Sampler.Temperature != 0.5 || c.Sampler.Seed != 9 || c.Slot != -1 {
		t.Errorf("parsed %+v", c)
	}
	if len(c.Stops) != 1 || c.Stops[0] != "x" {
		t.Errorf("stops %q", c.Stops)
	}
	for _, body := range []string{`{"prompt":[65,66]}`, `{"prompt":[[65,66]]}`} {
		if c, err := parse(body, false); err != nil || len(c.Prefill.Tokens) != 2 {
			t.Errorf("%s: %v %v", body, c.Prefill.Tokens, err)
		}
	}
	if c, err := parse(`{"prompt":["AB"]}`, false); err != nil || c.Prefill.Text != "AB" {
		t.Errorf("a batch of one text: %+v %v", c.Prefill, err)
	}
	// Text and token ids mixed: pieces for the backend to tokenize, runs of
	// ids together.
	c, err = parse(`{"prompt":[7,8,"AB",67]}`, false)
	if want := []Piece{{Tokens: []int32{7, 8}}, {Text: "AB"}, {Tokens: []int32{67}}}; err != nil || !reflect.DeepEqual(c.Pieces, want) ||
		c.Prefill.Text != "" || c.Prefill.Tokens != nil {
		t.Errorf("a mixed prompt: %+v %+v %v", c.Pieces, c.Prefill, err)
	}
	c, err = parse(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":4,"id_slot":2}`, true)
	if err != nil || c.Prefill.Messages[0].Content != "hi" || c.Prefill.Model != "m" || !c.IncludeUsage || c.NPredict != 4 || c.Slot != 2 {
		t.Errorf("chat: %+v %v", c, err)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"prompt":["a","b"]}`, "batches"},
		{`{"prompt":["a",-1]}`, "not a token id"},
		{`{"prompt":["a",null,1]}`, "batches"},
		{`{"prompt":""}`, "empty"},
		{`{}`, "prompt is required"},
		{`{"prompt":"a","n":2}`, "n must be 1"},
		{`{"prompt":"a","temperature":-1}`, "temperature"},
		{`{"prompt":"a","top_p":0}`, "top_p"},
		{`{"prompt":"a","max_tokens":-2}`, "max_tokens must be -1"},
		{`{"prompt":"a","stop":["1","2","3","4","5"]}`, "at most 4"},
		{`{"prompt":"a","id_slot":-5}`, "not a slot id"},
		{`[1]`, "must be a JSON object"},
	} {
		if _, err := parse(bad.body, false); err == nil || !strings.Contains(err.Error(), bad.want) || !isStatus(err, 400) {
			t.Errorf("%s: %v, want 400 %q", bad.body, err, bad.want)
		}
	}
	if _, err := parse(`{"messages":[]}`, true); err == nil {
		t.Error("empty messages accepted")
	}
	// Sampler fields over the defaults, logit biases in both forms, and the
	// ways of asking for log-probabilities.
	c, err = parse(`{"prompt":"a","min_p":0.1,"repeat_penalty":1.1,"repeat_last_n":-1,"presence_penalty":0.5,`+
		`"frequency_penalty":-0.5,"ignore_eos":true,"logit_bias":{"7":-100,"9":300},"logprobs":3}`, false)
	if err != nil || c.Sampler.MinP != 0.1 || c.Sampler.RepeatPenalty != 1.1 || c.Sampler.RepeatLastN != -1 ||
		c.Sampler.PresencePenalty != 0.5 || c.Sampler.FrequencyPenalty != -0.5 || !c.Sampler.IgnoreEOS ||
		c.Sampler.LogitBias[7] != -100 || c.Sampler.LogitBias[9] != 100 || !c.Logprobs || c.NProbs != 3 || c.Sampler.TopK != 7 {
		t.Errorf("sampler fields: %+v %v", c, err)
	}
	c, err = parse(`{"messages":[{"role":"user","content":"x"}],"logit_bias":[[5,false],[6,1.5]],"logprobs":true,"top_logprobs":2}`, true)
	if err != nil || c.Sampler.LogitBias[5] != -100 || c.Sampler.LogitBias[6] != 1.5 ||
		!c.Logprobs || c.NProbs != 2 {
		t.Errorf("chat logprobs and llama-server biases: %+v %v", c, err)
	}
	if c, err := parse(`{"prompt":"a","logprobs":false}`, false); err != nil || c.Logprobs {
		t.Errorf("logprobs false: %+v %v", c, err)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"prompt":"a","min_p":2}`, "min_p"},
		{`{"prompt":"a","repeat_last_n":-2}`, "repeat_last_n"},
		{`{"prompt":"a","logit_bias":{"x":1}}`, "not a token id"},
		{`{"prompt":"a","logit_bias":{"100":1}}`, "outside the vocabulary"},
		{`{"prompt":"a","logit_bias":[[1,"x"]]}`, "number or false"},
		{`{"prompt":"a","logprobs":21}`, "logprobs"},
		{`{"prompt":"a","top_logprobs":-1}`, "top_logprobs"},
		{`{"prompt":"a","logprobs":"yes"}`, "logprobs"},
	} {
		if _, err := parse(bad.body, false); err == nil || !strings.Contains(err.Error(), bad.want) || !isStatus(err, 400) {
			t.Errorf("%s: %v, want 400 %q", bad.body, err, bad.want)
		}
	}
}

// isStatus reports whether err is a run.Error of HTTP status code.
func isStatus(err error, code int) bool {
	e, ok := err.(*run.Error)
	return ok && e.Status == code
}
