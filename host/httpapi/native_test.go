package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// nativeReply is a /completion reply or stream event.
type nativeReply struct {
	Index              int            `json:"index"`
	Content            string         `json:"content"`
	Tokens             []int32        `json:"tokens"`
	IDSlot             int            `json:"id_slot"`
	Stop               bool           `json:"stop"`
	Model              string         `json:"model"`
	TokensPredicted    int            `json:"tokens_predicted"`
	TokensEvaluated    int            `json:"tokens_evaluated"`
	GenerationSettings map[string]any `json:"generation_settings"`
	Prompt             string         `json:"prompt"`
	HasNewLine         bool           `json:"has_new_line"`
	Truncated          bool           `json:"truncated"`
	StopType           string         `json:"stop_type"`
	StoppingWord       string         `json:"stopping_word"`
	TokensCached       int            `json:"tokens_cached"`
	Timings            *struct {
		CacheN     int `json:"cache_n"`
		PromptN    int `json:"prompt_n"`
		PredictedN int `json:"predicted_n"`
	} `json:"timings"`
	Probs []nativeProb `json:"completion_probabilities"`
}

// nativeProb is a position of completion_probabilities, as a client reads it.
type nativeProb struct {
	nativeAlternative
	TopLogprobs []nativeAlternative `json:"top_logprobs"`
}

type nativeAlternative struct {
	ID      int32   `json:"id"`
	Token   string  `json:"token"`
	Bytes   []int   `json:"bytes"`
	Logprob float32 `json:"logprob"`
}

func decodeNative(t *testing.T, body string) nativeReply {
	t.Helper()
	var r nativeReply
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return r
}

// nativeEvents reads a /completion stream: data lines only, no [DONE].
func nativeEvents(t *testing.T, body string) []nativeReply {
	t.Helper()
	var out []nativeReply
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok || d == "[DONE]" {
			t.Fatalf("a native stream has data lines only, no [DONE]: %q", line)
		}
		out = append(out, decodeNative(t, d))
	}
	return out
}

// refText is the mock's greedy text for prompt, from /v1/completions.
func refText(t *testing.T, h http.Handler, prompt string, n int) string {
	t.Helper()
	rec := post(h, "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":%d}`, prompt, n))
	var r struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &r) != nil || len(r.Choices) != 1 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	return r.Choices[0].Text
}

func byteTokens(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i])
	}
	return out
}

// TestNativeCompletion: /completion answers llama-server's native reply
// from the text completion path: the same text, the generated token ids
// with return_tokens, the prompt's counts (reused tokens as cache_n, none
// with cache_prompt false), the settings it ran with.
func TestNativeCompletion(t *testing.T) {
	_, h := newTestServer(t, 1)
	text := refText(t, h, "Once", 12)
	rec := post(h, "/completion", `{"prompt":"Once","n_predict":12,"return_tokens":true,"temperature":0,"stop":["#1","#2","#3","#4","#5"]}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	r := decodeNative(t, rec.Body.String())
	if r.Content != text || !reflect.DeepEqual(r.Tokens, byteTokens(text)) || !r.Stop || r.Model != "mock" || r.IDSlot != 0 || r.Index != 0 {
		t.Errorf("reply %+v, want the text %q and its tokens", r, text)
	}
	if r.TokensPredicted != 12 || r.TokensEvaluated != 4 || r.TokensCached != 16 || r.StopType != "limit" || r.Truncated ||
		r.StoppingWord != "" || r.Prompt != "Once" || r.HasNewLine != strings.Contains(text, "\n") || r.Probs != nil {
		t.Errorf("counts and stop: %+v", r)
	}
	gs := r.GenerationSettings
	if gs["n_predict"] != 12.0 || gs["temperature"] != 0.0 || gs["mirostat"] != 0.0 || gs["typical_p"] != 1.0 ||
		!reflect.DeepEqual(gs["stop"], []any{"#1", "#2", "#3", "#4", "#5"}) || gs["stream"] != false {
		t.Errorf("generation_settings %v", gs)
	}
	if tm := r.Timings; tm == nil || tm.PredictedN != 12 || tm.PromptN+tm.CacheN != 4 {
		t.Errorf("timings %+v", r.Timings)
	}

	// The slot kept the prompt: the same one again reuses it; with
	// cache_prompt false it is evaluated whole, and the text is the same.
	for _, tc := range []struct {
		body   string
		cached bool
	}{{`{"prompt":"Once","n_predict":12}`, true}, {`{"prompt":"Once","n_predict":12,"cache_prompt":false}`, false}} {
		r := decodeNative(t, post(h, "/completion", tc.body).Body.String())
		if r.Content != text || len(r.Tokens) != 0 || r.Timings == nil || (r.Timings.CacheN > 0) != tc.cached || r.Timings.PromptN+r.Timings.CacheN != 4 {
			t.Errorf("%s: %+v %+v", tc.body, r, r.Timings)
		}
	}
	if r := decodeNative(t, post(h, "/completion", `{"prompt":{"prompt_string":"Once"},"n_predict":3}`).Body.String()); r.Content != text[:3] {
		t.Errorf("a prompt_string object: %+v", r)
	}
}

// TestNativeStopAndStream: a stop string ends the reply (stop_type word),
// its tokens' probabilities left out of the whole reply; the stream is a
// chunk per token (text held back while a stop string may start comes in a
// later one), then the final event, and no [DONE].
func TestNativeStopAndStream(t *testing.T) {
	_, h := newTestServer(t, 1)
	text := refText(t, h, "Once", 40)
	stop := text[len(text)/2 : len(text)/2+3]
	cut := strings.Index(text, stop)
	body := `{"prompt":"Once","n_predict":40,"n_probs":2,"stop":` + mustJSON(stop)
	r := decodeNative(t, post(h, "/completion", body+`}`).Body.String())
	if r.Content != text[:cut] || r.StopType != "word" || r.StoppingWord != stop || r.TokensPredicted != cut+len(stop) {
		t.Fatalf("stop %q: %+v, want %q", stop, r, text[:cut])
	}
	if len(r.Probs) != cut {
		t.Errorf("%d probabilities for %d tokens of text", len(r.Probs), cut)
	}
	for i, p := range r.Probs {
		if p.ID != int32(text[i]) || p.Token != text[i:i+1] || !reflect.DeepEqual(p.Bytes, []int{int(text[i])}) ||
			len(p.TopLogprobs) != 2 || p.Logprob > 0 || p.TopLogprobs[0].Token == "" {
			t.Errorf("probability %d: %+v", i, p)
		}
	}

	evs := nativeEvents(t, post(h, "/completion", body+`,"stream":true}`).Body.String())
	var content strings.Builder
	var toks []int32
	for i, e := range evs[:len(evs)-1] {
		content.WriteString(e.Content)
		toks = append(toks, e.Tokens...)
		if e.Stop || len(e.Tokens) != 1 || len(e.Probs) != 1 || e.Probs[0].ID != e.Tokens[0] || e.TokensPredicted != i+1 || e.TokensEvaluated != 4 {
			t.Errorf("chunk %d: %+v", i, e)
		}
	}
	last := evs[len(evs)-1]
	if content.String() != text[:cut] || !reflect.DeepEqual(toks, byteTokens(text[:cut+len(stop)])) {
		t.Errorf("streamed %q and tokens %v, want %q and the stop string's tokens too", content.String(), toks, text[:cut])
	}
	if !last.Stop || last.Content != "" || len(last.Tokens) != 0 || last.StopType != "word" || last.StoppingWord != stop ||
		last.Timings == nil || last.Probs != nil || last.GenerationSettings["stream"] != true {
		t.Errorf("final event %+v", last)
	}
}

// failingBackend fails the decode of a prompt that starts with "Twice".
type failingBackend struct{ iface.Backend }

func (b failingBackend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	if p := req.Prompt; p != nil && strings.HasPrefix(string(tokenBytes(p.Tokens)), "Twice") {
		return iface.DecodeResult{}, fmt.Errorf("%w: prompt_test refuses it", iface.ErrBadRequest)
	}
	return b.Backend.Decode(ctx, req, emit)
}

func tokenBytes(toks []int32) []byte {
	b := make([]byte, len(toks))
	for i, t := range toks {
		b[i] = byte(t)
	}
	return b
}

// TestNativePrompts: a list of prompts, and n_cmpl, answer one reply each,
// in one array or one stream, by index; a completion that fails is the
// reply, or ends the stream with its error; no slot is left busy.
func TestNativePrompts(t *testing.T) {
	m, info := loadMock(t, 2)
	s, h := serve(t, failingBackend{m}, info, nil)
	once, twice := refText(t, h, "Once", 3), refText(t, h, "Thrice", 3)
	rec := post(h, "/completion", `{"prompt":["Once","Thrice"],"n_predict":3}`)
	var list []nativeReply
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &list) != nil || len(list) != 2 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if list[0].Index != 0 || list[0].Content != once || list[1].Index != 1 || list[1].Content != twice || list[1].Prompt != "Thrice" {
		t.Errorf("two prompts: %+v", list)
	}
	rec = post(h, "/completion", `{"prompt":"Once","n_predict":3,"n_cmpl":2,"seed":5}`)
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &list) != nil || len(list) != 2 ||
		list[0].GenerationSettings["seed"] != 5.0 || list[1].GenerationSettings["seed"] != 6.0 || list[1].Index != 1 {
		t.Errorf("n_cmpl 2: %d %s", rec.Code, rec.Body)
	}

	evs := nativeEvents(t, post(h, "/completion", `{"prompt":["Once","Thrice"],"n_predict":3,"stream":true}`).Body.String())
	var got []string
	text := map[int]string{}
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%d:%v", e.Index, e.Stop))
		text[e.Index] += e.Content
	}
	want := []string{"0:false", "0:false", "0:false", "0:true", "1:false", "1:false", "1:false", "1:true"}
	if !reflect.DeepEqual(got, want) || text[0] != once || text[1] != twice {
		t.Errorf("stream of two: %v %v, want %v", got, text, want)
	}

	if rec := post(h, "/completion", `{"prompt":["Once","Twice"],"n_predict":3}`); rec.Code != 400 || !strings.Contains(rec.Body.String(), "refuses") {
		t.Errorf("a second completion failing: %d %s", rec.Code, rec.Body)
	}
	body := post(h, "/completion", `{"prompt":["Once","Twice"],"n_predict":3,"stream":true}`).Body.String()
	lines := strings.Split(strings.TrimSpace(body), "\n\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[4], `data: {"error":`) || !strings.Contains(lines[4], "refuses") {
		t.Errorf("a second completion failing in a stream: %s", body)
	}
	for i, v := range s.Slots() {
		if v.Processing {
			t.Errorf("slot %d left busy", i)
		}
	}
}

// TestNativeMixedPrompt: a prompt of text and token ids is tokenized piece
// by piece (special tokens parsed, BOS only where it starts with text), and
// the reply's prompt is its tokens' text; the mock tokenizes the text as
// bytes.
func TestNativeMixedPrompt(t *testing.T) {
	m, info := loadMock(t, 1)
	tb := &pieceTokenizer{Backend: m}
	_, h := serve(t, tb, info, nil)
	r := decodeNative(t, post(h, "/completion", `{"prompt":["AB",67,68,"E"],"n_predict":2}`).Body.String())
	want := []iface.TokenizeOptions{{AddSpecial: true, ParseSpecial: true}, {ParseSpecial: true}}
	if !reflect.DeepEqual(tb.opts, want) || r.TokensEvaluated != 6 || r.Prompt != "<s>ABCDE" {
		t.Errorf("mixed prompt: tokenized with %+v, reply %+v", tb.opts, r)
	}
	// /v1/completions takes one as llama-server's does.
	var oai struct {
		Usage usage `json:"usage"`
	}
	if rec := post(h, "/v1/completions", `{"prompt":[7,"AB",67],"max_tokens":1}`); rec.Code != 200 ||
		json.Unmarshal(rec.Body.Bytes(), &oai) != nil || oai.Usage.PromptTokens != 4 || tb.opts[2].AddSpecial {
		t.Errorf("/v1/completions, mixed prompt: %d %s (tokenized with %+v)", rec.Code, rec.Body, tb.opts)
	}
	_, mh := newTestServer(t, 1)
	if r := decodeNative(t, post(mh, "/completion", `{"prompt":[1,"a"],"n_predict":1}`).Body.String()); r.TokensEvaluated != 2 {
		t.Errorf("mock, mixed prompt: %+v", r)
	}
}

// pieceTokenizer tokenizes text with options as bytes (BOS, 1, where
// special tokens are added) and detokenizes with BOS as "<s>".
type pieceTokenizer struct {
	iface.Backend
	opts []iface.TokenizeOptions
}

func (b *pieceTokenizer) Tokenize(ctx context.Context, req iface.PrefillRequest) (iface.Prompt, error) {
	o := req.Tokenize
	switch {
	case o == nil:
		return b.Backend.Tokenize(ctx, req)
	case len(req.Tokens) > 0:
		return iface.Prompt{Tokens: req.Tokens, Text: strings.ReplaceAll(string(tokenBytes(req.Tokens)), "\x01", "<s>")}, nil
	}
	b.opts = append(b.opts, *o)
	toks := byteTokens(req.Text)
	if o.AddSpecial {
		toks = append([]int32{1}, toks...)
	}
	return iface.Prompt{Tokens: toks}, nil
}

// TestNativeBadInput: what this engine does not honour is a 400 naming the
// field, so is a value llama-server refuses; a feature at its off value is
// taken; no slot is left busy.
func TestNativeBadInput(t *testing.T) {
	s, h := newTestServer(t, 1)
	for _, tc := range []struct{ body, param string }{
		{`{"prompt":"a","mirostat":2}`, "mirostat"},
		{`{"prompt":"a","samplers":["top_k"]}`, "samplers"},
		{`{"prompt":"a","foo":1}`, "foo"},
		{`{"prompt":"a","n_probs":21}`, "n_probs"},
		{`{"prompt":"a","logprobs":"x"}`, "logprobs"},
		{`{"prompt":[]}`, "prompt"},
		{`{"prompt":[["a"]]}`, "prompt[0]"},
		{`{"prompt":["a",[1,"b"],{}]}`, "prompt[2]"},
		{`{"prompt":{"prompt_string":"a","multimodal_data":["eA=="]}}`, "prompt.multimodal_data"},
		{`{}`, "prompt"},
		{`{"prompt":"a","n_cmpl":2}`, "n_cmpl"},
		{`{"prompt":"a","n":0}`, "n"},
		{`{"prompt":"a","temperature":-1}`, "temperature"},
		{`{"prompt":"a","n_predict":-2}`, "n_predict"},
		{`{"prompt":"a","stream_options":{"x":1}}`, "stream_options.x"},
		{`{"prompt":"a","dry_sequence_breakers":[]}`, "dry_sequence_breakers"},
		{`{"prompt":"a","lora":[{"id":0,"scale":1}]}`, "lora"},
		{`{"prompt":"a","return_progress":true}`, "return_progress"},
		{`{"prompt":"a","mirostat_tau":"x"}`, "mirostat_tau"},
		{`{"prompt":"a","response_fields":"content"}`, "response_fields"},
		{`{"prompt":"a","stream":true,"xtc_probability":0.5}`, "xtc_probability"},
		{`[1]`, ""},
	} {
		rec := post(h, "/completion", tc.body)
		var e struct {
			Error struct {
				Param *string `json:"param"`
			} `json:"error"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != 400 || tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
			t.Errorf("%s: %d %s, want a 400 naming %q", tc.body, rec.Code, rec.Body, tc.param)
		}
	}
	ok := `{"prompt":"a","n_predict":2,"mirostat":0,"mirostat_tau":5,"typical_p":1,"top_n_sigma":-1,"dry_multiplier":0,` +
		`"dry_sequence_breakers":["\n"],"lora":[],"post_sampling_probs":false,"n_probs":0,"cache_prompt":true,"verbose":false,` +
		`"stream_options":{"include_usage":true},"id_slot":-1,"model":"x"}`
	if rec := post(h, "/completion", ok); rec.Code != 200 || decodeNative(t, rec.Body.String()).Probs != nil {
		t.Errorf("features at their off values: %d %s", rec.Code, rec.Body)
	}
	for i, v := range s.Slots() {
		if v.Processing {
			t.Errorf("slot %d left busy", i)
		}
	}
}

// TestNativeResponseFields: response_fields keeps the final reply's fields
// named, a path through objects under the path itself.
func TestNativeResponseFields(t *testing.T) {
	_, h := newTestServer(t, 1)
	rec := post(h, "/completion", `{"prompt":"Once","n_predict":2,"response_fields":["content","generation_settings/n_predict","nope/x"]}`)
	var out map[string]any
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &out) != nil || len(out) != 2 || out["generation_settings/n_predict"] != 2.0 || out["content"] == nil {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

// TestOpenAITimingsAsLlamaServer: the OpenAI routes' timings and usage
// count the prompt as llama-server's do: prompt_n the tokens evaluated,
// cache_n and usage.prompt_tokens_details.cached_tokens those kept from the
// slot's sequence, prompt_tokens all of them.
func TestOpenAITimingsAsLlamaServer(t *testing.T) {
	_, h := newTestServer(t, 1)
	type reply struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			Details      struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Timings struct {
			CacheN  int `json:"cache_n"`
			PromptN int `json:"prompt_n"`
		} `json:"timings"`
	}
	var first, again reply
	for i, r := range []*reply{&first, &again} {
		rec := post(h, "/v1/completions", `{"prompt":"Once upon a time","max_tokens":4}`)
		if rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), r); err != nil {
			t.Fatal(err)
		}
		u, tm := r.Usage, r.Timings
		if u.PromptTokens != 16 || tm.PromptN+tm.CacheN != 16 || u.Details.CachedTokens != tm.CacheN {
			t.Errorf("request %d: usage %+v, timings %+v", i, u, tm)
		}
	}
	if first.Timings.CacheN != 0 || again.Timings.CacheN == 0 {
		t.Errorf("cache_n %d then %d: the second request reuses the first's prompt", first.Timings.CacheN, again.Timings.CacheN)
	}
}
