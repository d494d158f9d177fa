package native

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/host/httpapi/tokenin"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's /infill (post_infill, format_prompt_infill): code
// completion between a prefix and a suffix for models with FIM tokens.
// The prompt is built of token ids as llama-server builds it — the
// repository-level pattern of Qwen2.5-Coder's paper
//
//	[FIM_REP]myproject\n[FIM_SEP]filename0\n extra0 … [FIM_SEP]filename\n
//	[FIM_PRE]prefix prompt [FIM_SUF]suffix [FIM_MID]
//
// with the prefix and suffix cut to fit a batch (3:1) and the extra chunks
// to what the slot's context leaves — then run as the /completion of the
// body's completion fields, the reply /completion's. ReadInfill reads the
// body, Infill.Prompt builds the prompt through the backend's tokenizer and
// Infill.Convert makes the completions, each a step that fails its own way.

// infillBody is what /infill reads beyond the completion fields.
type infillBody struct {
	InputPrefix json.RawMessage `json:"input_prefix"`
	InputSuffix json.RawMessage `json:"input_suffix"`
	InputExtra  json.RawMessage `json:"input_extra"`
	Prompt      json.RawMessage `json:"prompt"`
}

// extraChunk is an input_extra element: a file of the repository.
type extraChunk struct {
	Filename string
	Text     string
}

// FIMMissing is what the vocabulary lacks for infill, in llama-server's
// words; "" when it has the prefix, suffix and middle tokens.
func FIMMissing(sp *iface.SpecialTokens) string {
	if sp == nil {
		return "prefix token is missing. suffix token is missing. middle token is missing. "
	}
	var b strings.Builder
	for _, t := range []struct {
		id   int32
		name string
	}{{sp.FIMPre, "prefix"}, {sp.FIMSuf, "suffix"}, {sp.FIMMid, "middle"}} {
		if t.id == iface.NoToken {
			b.WriteString(t.name + " token is missing. ")
		}
	}
	return b.String()
}

// Infill is a validated /infill body: the texts (or texts and token ids)
// of the prefix and suffix, the files, the prompt, and the body itself,
// whose completion fields the completion runs with.
type Infill struct {
	prefix, suffix any
	extra          []extraChunk
	prompt         string
	raw            []byte
}

// ReadInfill reads an /infill body. It is a pure function of the body: a
// body it refuses gets a *run.Error naming the field at fault.
func ReadInfill(raw []byte) (Infill, error) {
	var body infillBody
	if err := run.DecodeJSON(raw, &body); err != nil {
		return Infill{}, err
	}
	in, err := parseInfill(body)
	in.raw = raw
	return in, err
}

// parseInfill checks the body as post_infill does; where llama-server's
// checks set an error and go on (a prompt that is no string, a missing
// prefix or suffix), the request is refused here with that error.
func parseInfill(body infillBody) (Infill, error) {
	field := func(p, format string, args ...any) error {
		e := run.BadRequest(format, args...)
		e.Param = p
		return e
	}
	var in Infill
	if !absent(body.Prompt) && json.Unmarshal(body.Prompt, &in.prompt) != nil {
		return in, field("prompt", `"prompt" must be a string`)
	}
	var err error
	if absent(body.InputPrefix) {
		return in, field("input_prefix", `"input_prefix" is required`)
	}
	if in.prefix, err = tokenin.JSONValue(body.InputPrefix); err != nil {
		return in, field("input_prefix", "input_prefix is not valid JSON")
	}
	if absent(body.InputSuffix) {
		return in, field("input_suffix", `"input_suffix" is required`)
	}
	if in.suffix, err = tokenin.JSONValue(body.InputSuffix); err != nil {
		return in, field("input_suffix", "input_suffix is not valid JSON")
	}
	if absent(body.InputExtra) {
		return in, nil
	}
	var chunks []map[string]json.RawMessage
	if json.Unmarshal(body.InputExtra, &chunks) != nil {
		return in, field("input_extra", `"input_extra" must be an array of {"filename": string, "text": string}`)
	}
	for _, c := range chunks {
		ch := extraChunk{Filename: "tmp"} // llama-server's name for a chunk without one
		if t, ok := c["text"]; !ok || json.Unmarshal(t, &ch.Text) != nil || string(t) == "null" {
			return in, field("input_extra", `extra_context chunk must contain a "text" field with a string value`)
		}
		if f, ok := c["filename"]; ok && (json.Unmarshal(f, &ch.Filename) != nil || string(f) == "null") {
			return in, field("input_extra", `extra_context chunk's "filename" field must be a string`)
		}
		in.extra = append(in.extra, ch)
	}
	return in, nil
}

// infillTokens are an infill's pieces as token ids.
type infillTokens struct {
	prefix, suffix, prompt []int32
	extra                  []extraTokens
	repo, current          []int32 // "myproject\n" and "filename\n": the repository's and the file's names
	snippet                []int32 // the separator of chunks without FIM_SEP
}

type extraTokens struct{ filename, text []int32 }

// The texts llama-server puts in an infill prompt of its own: the
// repository's name, the current file's, and between chunks where the
// vocabulary has no FIM_SEP a separator written so that no model reads it
// as part of the code.
const (
	infillRepo    = "myproject\n"
	infillCurrent = "filename\n"
	infillSnippet = "\n\n--- snippet ---\n\n"
)

// InfillBudget is what bounds an infill's prompt: the logical batch the
// prefix and suffix are cut to fit, the engine's default n_predict and the
// slot's context that the extra chunks fill, and whether the suffix goes
// first (llama-server's --spm-infill).
type InfillBudget struct {
	NBatch, NPredict, NCtx int
	SPM                    bool
}

// Prompt is the infill's prompt as format_prompt_infill builds it, of the
// vocabulary's FIM tokens sp and the pieces tokenized by tok, within b.
func (in Infill) Prompt(tok tokenin.Tokenizer, sp iface.SpecialTokens, b InfillBudget) ([]int32, error) {
	p, err := in.tokens(tok)
	if err != nil {
		return nil, err
	}
	return formatInfill(sp, p, b), nil
}

// Convert is the infill run as the native completion of its body with the
// prompt built, over the engine's sampler and nPredict defaults.
func (in Infill) Convert(prompt []int32, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) ([]Completion, error) {
	body, err := completionOfInfill(in.raw, prompt)
	if err != nil {
		return nil, err
	}
	return Convert(body, sampler, nPredict, info)
}

// tokens tokenizes the pieces: the prefix and suffix as text (special
// tokens' text is text), the prompt with special tokens parsed, the files'
// names and texts as text.
func (in Infill) tokens(tt tokenin.Tokenizer) (infillTokens, error) {
	var p infillTokens
	var err error
	if p.prefix, err = tokenin.Mixed(tt, in.prefix, "input_prefix", false, false); err != nil {
		return p, err
	}
	if p.suffix, err = tokenin.Mixed(tt, in.suffix, "input_suffix", false, false); err != nil {
		return p, err
	}
	if p.prompt, err = tt.Tokenize(in.prompt, false, true); err != nil {
		return p, err
	}
	for _, s := range []struct {
		dst  *[]int32
		text string
	}{{&p.repo, infillRepo}, {&p.current, infillCurrent}, {&p.snippet, infillSnippet}} {
		if *s.dst, err = tt.Tokenize(s.text, false, false); err != nil {
			return p, err
		}
	}
	for _, c := range in.extra {
		var x extraTokens
		if x.filename, err = tt.Tokenize(c.Filename+"\n", false, false); err != nil {
			return p, err
		}
		if x.text, err = tt.Tokenize(c.Text, false, false); err != nil {
			return p, err
		}
		p.extra = append(p.extra, x)
	}
	return p, nil
}

// formatInfill is format_prompt_infill: the extra chunks' repository
// context (its last n_extra_take tokens), then [FIM_PRE] the prefix's last
// tokens and the prompt, [FIM_SUF] the suffix's first tokens (in the other
// order with spm), [FIM_MID]; BOS first where the vocabulary adds it.
func formatInfill(sp iface.SpecialTokens, p infillTokens, b InfillBudget) []int32 {
	var extra []int32
	if sp.FIMRep != iface.NoToken {
		extra = append(append(extra, sp.FIMRep), p.repo...)
	}
	for _, c := range p.extra {
		if sp.FIMSep != iface.NoToken {
			extra = append(append(extra, sp.FIMSep), c.filename...)
		} else {
			extra = append(extra, p.snippet...)
		}
		extra = append(extra, c.text...)
	}
	if sp.FIMSep != iface.NoToken {
		extra = append(append(extra, sp.FIMSep), p.current...)
	}
	// The prefix and suffix fit a batch, 3:1; the extra context fills what
	// the slot's context leaves after a batch and twice the reply.
	nPrefix := min(len(p.prefix), 3*(b.NBatch/4))
	nSuffix := min(len(p.suffix), max(0, b.NBatch/4-(2+len(p.prompt))))
	nExtra := min(max(0, b.NCtx-b.NBatch-2*b.NPredict), len(extra))

	prefix := append([]int32{sp.FIMPre}, p.prefix[len(p.prefix)-nPrefix:]...)
	prefix = append(prefix, p.prompt...)
	suffix := append([]int32{sp.FIMSuf}, p.suffix[:nSuffix]...)
	first, second := prefix, suffix
	if b.SPM {
		first, second = suffix, prefix
	}
	var out []int32
	out = append(out, extra[len(extra)-nExtra:]...)
	if sp.AddBOS {
		out = append(out, sp.BOS)
	}
	out = append(out, first...)
	out = append(out, second...)
	return append(out, sp.FIMMid)
}

// completionOfInfill is the /completion body an infill runs as: its own
// body with the prompt as the token ids built, the infill's fields dropped.
func completionOfInfill(raw []byte, prompt []int32) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, run.BadRequest("request body is not a JSON object")
	}
	for _, k := range []string{"input_prefix", "input_suffix", "input_extra"} {
		delete(obj, k)
	}
	ids, err := json.Marshal(prompt)
	if err != nil {
		return nil, err
	}
	obj["prompt"] = ids
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(obj); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func absent(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
