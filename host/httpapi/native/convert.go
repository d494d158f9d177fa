// Package native is llama-server's native completion, POST /completion
// (its handle_completions_impl answering TASK_RESPONSE_TYPE_NONE): Convert
// reads a body into one run's request for each prompt and each of its
// n_cmpl, and Sink writes the runs' events into one reply or stream in
// llama-server's shape, each completion with its index; /infill
// (infill.go) runs as the /completion of its body with the prompt it
// builds. Unlike llama-server, a field this engine does not honour is
// refused, naming it.
package native

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Completion is one completion of a /completion request: the request it
// runs, and what its reply needs besides the run.
type Completion struct {
	Request        request.Completion
	Index          int      // the completion's place among the request's (prompt × n_cmpl)
	ReturnTokens   bool     // the whole reply lists the generated tokens' ids
	ResponseFields []string // the final reply's fields, where given (response_fields)
	PromptText     string   // the prompt as sent, where it was text
}

// body holds the fields /completion reads itself; those named in passed go
// to request.Parse, which reads them as llama-server does.
type body struct {
	Prompt         json.RawMessage `json:"prompt"`
	Stop           json.RawMessage `json:"stop"`
	NProbs         json.RawMessage `json:"n_probs"`
	Logprobs       json.RawMessage `json:"logprobs"` // n_probs where that is absent
	NCmpl          *int64          `json:"n_cmpl"`
	N              *int64          `json:"n"` // n_cmpl where that is absent
	CachePrompt    *bool           `json:"cache_prompt"`
	ReturnTokens   *bool           `json:"return_tokens"`
	ResponseFields []string        `json:"response_fields"`
	// StreamOptions and Verbose change nothing of a native reply, in
	// llama-server either: include_usage and __verbose are OpenAI replies'.
	StreamOptions *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
	Verbose *bool `json:"verbose"`
}

var own = []string{"prompt", "stop", "n_probs", "logprobs", "n_cmpl", "n", "cache_prompt", "return_tokens",
	"response_fields", "stream_options", "verbose"}

var passed = []string{"model", "stream", "n_predict", "max_completion_tokens", "max_tokens", "n_keep",
	"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
	"frequency_penalty", "ignore_eos", "seed", "logit_bias", "id_slot", "json_schema", "grammar"}

// offField is a /completion field of a sampler or feature this engine does
// not have: taken where its value leaves the feature off, as llama-server's
// default does, and reported with that value in generation_settings; any
// other value is refused.
type offField struct {
	name string
	what string // the feature, for the refusal
	off  any    // the value that leaves it off
	ok   func(json.RawMessage) bool
}

var offFields = []offField{
	{"mirostat", "Mirostat sampler", 0, numberIs(func(f float64) bool { return f <= 0 })},
	{"dynatemp_range", "dynamic temperature", 0, numberIs(func(f float64) bool { return f <= 0 })},
	{"top_n_sigma", "top-n-sigma sampler", -1, numberIs(func(f float64) bool { return f <= 0 })},
	{"xtc_probability", "XTC sampler", 0, numberIs(func(f float64) bool { return f <= 0 })},
	{"typical_p", "locally typical sampler", 1, numberIs(func(f float64) bool { return f >= 1 })},
	{"dry_multiplier", "DRY sampler", 0, numberIs(func(f float64) bool { return f == 0 })},
	{"adaptive_target", "adaptive-p sampler", -1, numberIs(func(f float64) bool { return f < 0 })},
	{"min_keep", "min_keep floor of the samplers", 0, numberIs(func(f float64) bool { return f == 0 })},
	{"n_indent", "indentation limit", 0, numberIs(func(f float64) bool { return f == 0 })},
	{"n_discard", "context shift size of its own per request (a shift discards half)", 0, numberIs(func(f float64) bool { return f == 0 })},
	{"t_max_predict_ms", "time limit on prediction", -1, numberIs(func(f float64) bool { return f <= 0 })},
	{"sse_ping_interval", "SSE pings", -1, numberIs(func(f float64) bool { return f <= 0 })},
	{"reasoning_budget_tokens", "reasoning budget", -1, numberIs(func(f float64) bool { return f == -1 })},
	{"timings_per_token", "timings in each streamed chunk", false, isFalse},
	{"return_progress", "prompt progress events", false, isFalse},
	{"post_sampling_probs", "probabilities after the sampling chain", false, isFalse},
	{"backend_sampling", "backend sampling switch", false, isFalse},
	{"grammar_lazy", "lazy grammars", false, isFalse},
	{"reasoning_control", "reasoning control", false, isFalse},
	{"lora", "per-request LoRA adapters", []any{}, isEmptyArray},
	{"grammar_triggers", "grammar triggers", []any{}, isEmptyArray},
	{"preserved_tokens", "preserved tokens", []any{}, isEmptyArray},
}

// moot are the parameters of those features, which change nothing
// while the feature is off: any number is taken (dry_sequence_breakers, a
// non-empty array of strings, as llama-server requires).
var moot = []string{"mirostat_tau", "mirostat_eta", "dynatemp_exponent", "xtc_threshold", "dry_base",
	"dry_allowed_length", "dry_penalty_last_n", "adaptive_decay"}

func numberIs(ok func(float64) bool) func(json.RawMessage) bool {
	return func(v json.RawMessage) bool {
		var f float64
		return json.Unmarshal(v, &f) == nil && ok(f)
	}
}

func isFalse(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "false" }

func isEmptyArray(v json.RawMessage) bool {
	var a []json.RawMessage
	return json.Unmarshal(v, &a) == nil && a != nil && len(a) == 0
}

// Convert validates a /completion body, over the engine's sampler and
// nPredict defaults: one completion for each prompt and each of its n_cmpl,
// in llama-server's order of their indexes. It is a pure function of the
// body: a body it refuses gets a *run.Error naming the field at fault.
func Convert(raw []byte, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) ([]Completion, error) {
	var fields map[string]json.RawMessage
	if err := run.DecodeJSON(raw, &fields); err != nil {
		return nil, err
	}
	if fields == nil {
		return nil, run.BadRequest("request body must be a JSON object")
	}
	if err := checkFields(fields); err != nil {
		return nil, err
	}
	// The fields but the prompt, which may be long and is read below: each
	// pass of encoding/json over a long prompt of ids is slow.
	rest := maps.Clone(fields)
	delete(rest, "prompt")
	var req body
	if err := run.DecodeJSON(rawObject(rest), &req); err != nil {
		return nil, err
	}
	req.Prompt = fields["prompt"]
	prompts, err := splitPrompts(req.Prompt)
	if err != nil {
		return nil, err
	}
	stops, err := request.ReadStops(req.Stop, 0)
	if err != nil {
		return nil, err
	}
	nProbs, err := readNProbs(req)
	if err != nil {
		return nil, err
	}
	nCmpl, err := readNCmpl(req, info)
	if err != nil {
		return nil, err
	}
	pass := map[string]json.RawMessage{}
	for _, k := range passed {
		if v, ok := fields[k]; ok {
			pass[k] = v
		}
	}
	// The passed fields are decoded once, without the prompt; each prompt
	// goes into a copy of them.
	base, err := request.Decode(rawObject(pass), false, info)
	if err != nil {
		return nil, err
	}
	var out []Completion
	for i, p := range prompts {
		b := base
		b.Prompt = p
		for j := range nCmpl {
			c, err := request.ParseDecoded(b, false, sampler, nPredict, info)
			if err != nil {
				return nil, err
			}
			c.Stops = stops
			c.Logprobs, c.NProbs = nProbs > 0, nProbs
			c.Sampler.Seed += uint64(j) // each further completion of a prompt samples on, as llama-server's children
			c.NoCache = req.CachePrompt != nil && !*req.CachePrompt
			nc := Completion{Request: c, Index: i*nCmpl + j, ReturnTokens: req.ReturnTokens != nil && *req.ReturnTokens,
				ResponseFields: req.ResponseFields}
			if len(p) > 0 && p[0] == '"' {
				_ = json.Unmarshal(p, &nc.PromptText) // a text prompt is echoed where the backend cannot detokenize
			}
			out = append(out, nc)
		}
	}
	return out, nil
}

// rawObject writes fields, whose values are JSON already (read from a valid
// body), as one object: json.Marshal would scan every value again, a prompt
// of token ids included.
func rawObject(fields map[string]json.RawMessage) []byte {
	keys := make([]string, 0, len(fields))
	n := 2
	for k, v := range fields {
		keys = append(keys, k)
		n += len(k) + len(v) + 4
	}
	sort.Strings(keys)
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, k) // the names are passed's: plain ASCII
		b = append(b, ':')
		b = append(b, fields[k]...)
	}
	return append(b, '}')
}

// checkFields refuses, naming the first (sorted), a field that is
// neither read here nor one of offFields' at its off value.
func checkFields(fields map[string]json.RawMessage) error {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := bytes.TrimSpace(fields[k])
		if slices.Contains(own, k) || slices.Contains(passed, k) || string(v) == "null" {
			continue
		}
		if err := checkInert(k, v); err != nil {
			return err
		}
	}
	if raw := bytes.TrimSpace(fields["stream_options"]); len(raw) > 0 && string(raw) != "null" {
		return run.CheckFields(raw, "stream_options", []string{"include_usage"})
	}
	return nil
}

// checkInert takes a field of offFields at its off value or one of
// moot's, and refuses any other.
func checkInert(k string, v json.RawMessage) error {
	refuse := func(format string, args ...any) error {
		e := run.BadRequest(format, args...)
		e.Param = k
		return e
	}
	if i := slices.IndexFunc(offFields, func(f offField) bool { return f.name == k }); i >= 0 {
		f := offFields[i]
		if f.ok(v) {
			return nil
		}
		off, _ := json.Marshal(f.off)
		return refuse("%s %s is not supported: this engine has no %s (send %s or leave it out)", k, v, f.what, off)
	}
	if k == "dry_sequence_breakers" {
		var s []string
		if json.Unmarshal(v, &s) != nil || len(s) == 0 {
			return refuse("dry_sequence_breakers must be a non-empty array of strings")
		}
		return nil
	}
	if slices.Contains(moot, k) {
		if !numberIs(func(float64) bool { return true })(v) {
			return refuse("%s must be a number", k)
		}
		return nil
	}
	return refuse("%s is not supported by this engine", k)
}

// splitPrompts splits prompt as llama-server's tokenize_input_prompts
// does: an array without token ids at its top is a list of prompts, anything
// else one prompt. A prompt is text, token ids, the two mixed, or an object
// whose prompt_string is one of those.
func splitPrompts(raw json.RawMessage) ([]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, run.BadRequest("prompt is required")
	}
	if ids, ok := request.IDArray(raw); ok && len(ids) > 0 { // token ids, read in one pass
		return []json.RawMessage{raw}, nil
	}
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || hasTokenID(list) {
		p, err := readPrompt(raw, "prompt")
		return []json.RawMessage{p}, err
	}
	if len(list) == 0 {
		return nil, run.BadRequest("prompt must not be empty")
	}
	for i, p := range list {
		var err error
		if list[i], err = readPrompt(p, fmt.Sprintf("prompt[%d]", i)); err != nil {
			return nil, err
		}
	}
	return list, nil
}

func hasTokenID(elems []json.RawMessage) bool {
	for _, e := range elems {
		var id int64
		if string(bytes.TrimSpace(e)) != "null" && json.Unmarshal(e, &id) == nil {
			return true
		}
	}
	return false
}

// readPrompt checks one prompt at path: text, or an array of token ids and
// text (request.Parse reads either), or {"prompt_string": …}, which is its
// prompt; multimodal_data is refused (no vision here).
func readPrompt(raw json.RawMessage, path string) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if _, ok := request.IDArray(raw); ok {
		return raw, nil
	}
	var s string
	var elems []json.RawMessage
	switch {
	case json.Unmarshal(raw, &s) == nil && string(raw) != "null":
		return raw, nil
	case json.Unmarshal(raw, &elems) == nil && raw[0] == '[':
		// Token ids, alone or mixed with strings (none: an empty prompt).
		for _, e := range elems {
			var id int64
			if json.Unmarshal(e, &s) != nil && json.Unmarshal(e, &id) != nil || string(bytes.TrimSpace(e)) == "null" {
				return nil, run.BadRequest("%s must be a string, token ids, or strings and token ids mixed", path)
			}
		}
		if len(elems) > 0 && !hasTokenID(elems) {
			return nil, run.BadRequest("%s: an array of strings alone is not a prompt (a list of prompts is prompt's own array)", path)
		}
		return raw, nil
	}
	var obj struct {
		PromptString   json.RawMessage `json:"prompt_string"`
		MultimodalData json.RawMessage `json:"multimodal_data"`
	}
	if raw[0] != '{' || json.Unmarshal(raw, &obj) != nil || len(obj.PromptString) == 0 {
		return nil, run.BadRequest("%s must be a string, token ids, strings and token ids mixed, or an object with prompt_string", path)
	}
	if err := run.CheckFields(raw, path, []string{"prompt_string", "multimodal_data"}); err != nil {
		return nil, err
	}
	if md := bytes.TrimSpace(obj.MultimodalData); len(md) > 0 && string(md) != "null" {
		return nil, run.BadRequest("%s.multimodal_data is not supported: this engine has no multimodal model", path)
	}
	if p := bytes.TrimSpace(obj.PromptString); len(p) > 0 && p[0] == '{' {
		return nil, run.BadRequest("%s.prompt_string must be a string, token ids, or strings and token ids mixed", path)
	}
	return readPrompt(obj.PromptString, path+".prompt_string")
}

// readNProbs reads n_probs, or logprobs where it is absent: the
// alternatives to report at each position, 0 or less for no probabilities;
// a boolean counts as 0 or 1, as llama-server reads one.
func readNProbs(req body) (int, error) {
	name, raw := "n_probs", bytes.TrimSpace(req.NProbs)
	if len(raw) == 0 || string(raw) == "null" {
		name, raw = "logprobs", bytes.TrimSpace(req.Logprobs)
	}
	var n int64
	switch s := string(raw); {
	case s == "" || s == "null" || s == "false":
		return 0, nil
	case s == "true":
		n = 1
	default:
		if err := json.Unmarshal(raw, &n); err != nil {
			e := run.BadRequest("%s must be an integer, got %s", name, raw)
			e.Param = name
			return 0, e
		}
	}
	if n > request.MaxTopLogprobs {
		e := run.BadRequest("%s must be at most %d here, got %d", name, request.MaxTopLogprobs, n)
		e.Param = name
		return 0, e
	}
	return int(max(n, 0)), nil
}

// readNCmpl reads n_cmpl, or n where it is absent: the completions of each
// prompt, 1 to the slot count (llama-server's limit, its n_parallel).
func readNCmpl(req body, info iface.BackendInfo) (int, error) {
	name, v := "n_cmpl", req.NCmpl
	if v == nil {
		name, v = "n", req.N
	}
	if v == nil {
		return 1, nil
	}
	if *v < 1 || *v > int64(max(info.NSlots, 1)) {
		e := run.BadRequest("%s must be in [1, %d] (the slots), got %d", name, max(info.NSlots, 1), *v)
		e.Param = name
		return 0, e
	}
	return int(*v), nil
}
