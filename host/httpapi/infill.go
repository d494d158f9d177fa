package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
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
// to what the slot's context leaves — then run as a native completion
// (native.go) of the body's completion fields, the reply /completion's.

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

// fimMissing is what the vocabulary lacks for infill, in llama-server's
// words; "" when it has the prefix, suffix and middle tokens.
func fimMissing(sp *iface.SpecialTokens) string {
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

func (a *api) infill(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	ctx := r.Context()
	raw, b, info, e := a.bodyAndBackend(w, r)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	if missing := fimMissing(info.Special); missing != "" {
		run.WriteError(w, notSupported("Infill is not supported by this model: "+missing))
		return
	}
	var body infillBody
	if err := run.DecodeJSON(raw, &body); err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "reading the request", err))
		return
	}
	in, e := parseInfill(body)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	tt := textTokens{ctx: ctx, b: b}
	p, err := in.tokens(tt)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "tokenizing the input", err))
		return
	}
	prompt := formatInfill(*info.Special, p, infillBudget{nBatch: infillBatch(info), nPredict: a.s.Tunables().NPredict(),
		nCtx: info.SlotCtx(), spm: a.spmInfill})
	body2, err := completionOfInfill(raw, prompt)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "reading the request", err))
		return
	}
	a.completeNative(w, r, body2, arrived)
}

// infillBatch is the n_batch infill's budget takes: the backend's, else
// llama-server's default.
func infillBatch(info iface.BackendInfo) int {
	if info.NBatch > 0 {
		return info.NBatch
	}
	return 2048
}

// infillInput is a validated body: the texts (or texts and token ids) of
// the prefix and suffix, the files, the prompt.
type infillInput struct {
	prefix, suffix any
	extra          []extraChunk
	prompt         string
}

// parseInfill checks the body as post_infill does; where llama-server's
// checks set an error and go on (a prompt that is no string, a missing
// prefix or suffix), the request is refused here with that error.
func parseInfill(body infillBody) (infillInput, *apiError) {
	field := func(p, format string, args ...any) *apiError {
		e := badRequest(format, args...)
		e.Param = p
		return e
	}
	var in infillInput
	if !isAbsent(body.Prompt) && json.Unmarshal(body.Prompt, &in.prompt) != nil {
		return in, field("prompt", `"prompt" must be a string`)
	}
	var err error
	if isAbsent(body.InputPrefix) {
		return in, field("input_prefix", `"input_prefix" is required`)
	}
	if in.prefix, err = jsonValue(body.InputPrefix); err != nil {
		return in, field("input_prefix", "input_prefix is not valid JSON")
	}
	if isAbsent(body.InputSuffix) {
		return in, field("input_suffix", `"input_suffix" is required`)
	}
	if in.suffix, err = jsonValue(body.InputSuffix); err != nil {
		return in, field("input_suffix", "input_suffix is not valid JSON")
	}
	if isAbsent(body.InputExtra) {
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

// tokens tokenizes the pieces: the prefix and suffix as text (special
// tokens' text is text), the prompt with special tokens parsed, the files'
// names and texts as text.
func (in infillInput) tokens(tt textTokens) (infillTokens, error) {
	var p infillTokens
	var err error
	if p.prefix, err = tt.mixed(in.prefix, "input_prefix", false, false); err != nil {
		return p, err
	}
	if p.suffix, err = tt.mixed(in.suffix, "input_suffix", false, false); err != nil {
		return p, err
	}
	if p.prompt, err = tt.text(in.prompt, false, true); err != nil {
		return p, err
	}
	for _, s := range []struct {
		dst  *[]int32
		text string
	}{{&p.repo, infillRepo}, {&p.current, infillCurrent}, {&p.snippet, infillSnippet}} {
		if *s.dst, err = tt.text(s.text, false, false); err != nil {
			return p, err
		}
	}
	for _, c := range in.extra {
		var x extraTokens
		if x.filename, err = tt.text(c.Filename+"\n", false, false); err != nil {
			return p, err
		}
		if x.text, err = tt.text(c.Text, false, false); err != nil {
			return p, err
		}
		p.extra = append(p.extra, x)
	}
	return p, nil
}

// infillBudget is what bounds the prompt: the logical batch the prefix and
// suffix are cut to fit, the engine's default n_predict and the slot's
// context that the extra chunks fill, and whether the suffix goes first
// (llama-server's --spm-infill).
type infillBudget struct {
	nBatch, nPredict, nCtx int
	spm                    bool
}

// formatInfill is format_prompt_infill: the extra chunks' repository
// context (its last n_extra_take tokens), then [FIM_PRE] the prefix's last
// tokens and the prompt, [FIM_SUF] the suffix's first tokens (in the other
// order with spm), [FIM_MID]; BOS first where the vocabulary adds it.
func formatInfill(sp iface.SpecialTokens, p infillTokens, b infillBudget) []int32 {
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
	nPrefix := min(len(p.prefix), 3*(b.nBatch/4))
	nSuffix := min(len(p.suffix), max(0, b.nBatch/4-(2+len(p.prompt))))
	nExtra := min(max(0, b.nCtx-b.nBatch-2*b.nPredict), len(extra))

	prefix := append([]int32{sp.FIMPre}, p.prefix[len(p.prefix)-nPrefix:]...)
	prefix = append(prefix, p.prompt...)
	suffix := append([]int32{sp.FIMSuf}, p.suffix[:nSuffix]...)
	first, second := prefix, suffix
	if b.spm {
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
		return nil, badRequest("request body is not a JSON object")
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
