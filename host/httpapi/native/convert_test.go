package native

import (
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// TestConvert: a /completion body is one completion for each prompt and
// each of its n_cmpl, in llama-server's order of their indexes, or a 400
// naming the field at fault.
func TestConvert(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", NCtx: 100, NVocab: 50, NSlots: 2}
	def := iface.SamplerParams{Temperature: 0.5, Seed: 10}
	parse := func(body string) ([]Completion, error) { return Convert([]byte(body), def, -1, info) }

	cs, err := parse(`{"prompt":["ab","cd"],"n_cmpl":2,"n_predict":3,"stop":["x","y","z","w","v"],"n_probs":2,` +
		`"cache_prompt":false,"return_tokens":true,"response_fields":["content"],"stream":true}`)
	if err != nil || len(cs) != 4 {
		t.Fatalf("%d completions, %v", len(cs), err)
	}
	for i, c := range cs {
		prompt := []string{"ab", "ab", "cd", "cd"}[i]
		r := c.Request
		if c.Index != i || c.PromptText != prompt || !c.ReturnTokens ||
			len(c.ResponseFields) != 1 || r.Chat || !r.Stream || r.NPredict != 3 || len(r.Stops) != 5 ||
			!r.Logprobs || r.NProbs != 2 || !r.NoCache || r.Prefill.Text != prompt || r.Sampler.Seed != 10+uint64(i%2) {
			t.Errorf("completion %d: %+v", i, c)
		}
	}
	for body, want := range map[string]string{
		`{"prompt":{"prompt_string":"hi"}}`: "hi",
		`{"prompt":"hi","logprobs":true}`:   "hi",
	} {
		cs, err := parse(body)
		if err != nil || len(cs) != 1 || cs[0].Request.Prefill.Text != want || cs[0].Index != 0 {
			t.Errorf("%s: %+v %v", body, cs, err)
		}
	}
	if cs, err := parse(`{"prompt":[1,2,"x"]}`); err != nil || len(cs) != 1 || len(cs[0].Request.Pieces) != 2 {
		t.Errorf("a mixed prompt: %+v %v", cs, err)
	}

	for _, c := range []struct{ body, err, param string }{
		{`{}`, "prompt is required", "prompt"},
		{`{"prompt":[]}`, "prompt must not be empty", "prompt"},
		{`{"prompt":[["a"]]}`, "prompt[0]: an array of strings alone is not a prompt (a list of prompts is prompt's own array)", "prompt[0]"},
		{`{"prompt":{"prompt_string":"a","multimodal_data":["eA=="]}}`, "prompt.multimodal_data is not supported: this engine has no multimodal model", "prompt.multimodal_data"},
		{`{"prompt":"a","n_cmpl":3}`, "n_cmpl must be in [1, 2] (the slots), got 3", "n_cmpl"},
		{`{"prompt":"a","n_probs":21}`, "n_probs must be at most 20 here, got 21", "n_probs"},
		{`{"prompt":"a","mirostat":2}`, "mirostat 2 is not supported: this engine has no Mirostat sampler (send 0 or leave it out)", "mirostat"},
		{`{"prompt":"a","foo":1}`, "foo is not supported by this engine", "foo"},
		{`{"prompt":"a","n_predict":-2}`, "n_predict must be -1 (no limit) or in [0, 2147483647], got -2", "n_predict"},
		{`{"prompt":"a","stream_options":{"x":1}}`, "stream_options.x is not supported by this engine", "stream_options.x"},
	} {
		_, err := parse(c.body)
		var e *run.Error
		if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Msg != c.err || e.Param != c.param {
			t.Errorf("%s: %#v, want 400 %q (param %s)", c.body, err, c.err, c.param)
		}
	}
}

// rawObject writes what json.Marshal writes for the same fields.
func TestRawObjectIsMarshal(t *testing.T) {
	fields := map[string]json.RawMessage{"prompt": json.RawMessage(`[1, 2,3]`), "temperature": json.RawMessage(`0.5`),
		"stop": json.RawMessage(`["a","\u00e9"]`), "n_predict": json.RawMessage(`4`)}
	want, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(rawObject(fields), &a); err != nil {
		t.Fatalf("rawObject wrote bad JSON %s: %v", rawObject(fields), err)
	}
	_ = json.Unmarshal(want, &b)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("rawObject = %s; json.Marshal = %s", rawObject(fields), want)
	}
}

// BenchmarkConvertTokenIDs: a /completion body whose prompt is 128 K token
// ids, as a coordinator or benchmark sends a long context.
func BenchmarkConvertTokenIDs(b *testing.B) {
	ids := make([]int, 131072)
	for i := range ids {
		ids[i] = (i * 7919) % 151000
	}
	body, _ := json.Marshal(map[string]any{"prompt": ids, "n_predict": 1, "temperature": 0, "cache_prompt": true})
	info := iface.BackendInfo{NCtx: 1 << 20}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Convert(body, iface.SamplerParams{}, 16, info); err != nil {
			b.Fatal(err)
		}
	}
}
