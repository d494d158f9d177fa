package httpapi

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"unicode/utf8"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// llama-server's /tokenize, /detokenize, /apply-template and /props, with
// its request and reply fields (tools/server/server-context.cpp); the
// backend answers through Tokenize with iface.TokenizeOptions.

// tokenizeRequest is /tokenize's body; absent switches are llama-server's
// defaults (add_special false, parse_special true).
type tokenizeRequest struct {
	Content      json.RawMessage `json:"content"`
	AddSpecial   *bool           `json:"add_special"`
	ParseSpecial *bool           `json:"parse_special"`
	WithPieces   bool            `json:"with_pieces"`
}

// tokenPiece is a with_pieces entry: the piece as text where it is valid
// UTF-8, else its bytes.
type tokenPiece struct {
	ID    int32 `json:"id"`
	Piece any   `json:"piece"`
}

func (a *api) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := a.readJSON(w, r, &req); err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	if len(req.Content) == 0 || string(req.Content) == "null" { // llama-server: no content, no tokens
		run.WriteJSON(w, http.StatusOK, map[string]any{"tokens": []int32{}})
		return
	}
	var text string
	if err := json.Unmarshal(req.Content, &text); err != nil {
		e := badRequest("content must be a string (a mix of text and token ids is not supported here)")
		e.Param = "content"
		run.WriteError(w, e)
		return
	}
	o := &iface.TokenizeOptions{ParseSpecial: true, WithPieces: req.WithPieces}
	if req.AddSpecial != nil {
		o.AddSpecial = *req.AddSpecial
	}
	if req.ParseSpecial != nil {
		o.ParseSpecial = *req.ParseSpecial
	}
	p, ok := a.backendTokenize(w, r, iface.PrefillRequest{Text: text, Tokenize: o})
	if !ok {
		return
	}
	if !req.WithPieces {
		run.WriteJSON(w, http.StatusOK, map[string]any{"tokens": nonNil(p.Tokens)})
		return
	}
	if len(p.Pieces) != len(p.Tokens) {
		run.WriteError(w, &apiError{Status: http.StatusInternalServerError, Type: "server_error",
			Msg: fmt.Sprintf("the backend gave %d pieces for %d tokens", len(p.Pieces), len(p.Tokens))})
		return
	}
	out := make([]tokenPiece, len(p.Tokens))
	for i, id := range p.Tokens {
		out[i] = tokenPiece{ID: id, Piece: pieceJSON(p.Pieces[i])}
	}
	run.WriteJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

// pieceJSON is a piece as llama-server writes it: a string where valid
// UTF-8, else the array of its bytes.
func pieceJSON(s string) any {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

func (a *api) detokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := a.readJSON(w, r, &req); err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	if len(req.Tokens) == 0 {
		run.WriteJSON(w, http.StatusOK, map[string]string{"content": ""})
		return
	}
	toks := make([]int32, len(req.Tokens))
	for i, t := range req.Tokens {
		if t < 0 || t > math.MaxInt32 {
			e := badRequest("tokens[%d] (%d) is not a token id", i, t)
			e.Param = "tokens"
			run.WriteError(w, e)
			return
		}
		toks[i] = int32(t)
	}
	p, ok := a.backendTokenize(w, r, iface.PrefillRequest{Tokens: toks, Tokenize: &iface.TokenizeOptions{}})
	if ok {
		run.WriteJSON(w, http.StatusOK, map[string]string{"content": p.Text})
	}
}

// applyTemplate is /apply-template: the prompt a chat completion of the
// body would render (its tools and template variables too), unevaluated.
func (a *api) applyTemplate(w http.ResponseWriter, r *http.Request) {
	var body host.ChatBody
	if err := a.readJSON(w, r, &body); err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	_, info := a.s.Backend()
	req, err := body.Prefill(0, info)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", request.FieldError(err)))
		return
	}
	req.Model, req.Tokenize = "", &iface.TokenizeOptions{}
	if p, ok := a.backendTokenize(w, r, req); ok {
		run.WriteJSON(w, http.StatusOK, map[string]string{"prompt": p.Text})
	}
}

// setProps is POST /props: llama-server changes nothing through it, and
// refuses it unless started with --props, which this engine has no use for,
// so it always answers llama-server's refusal.
func (a *api) setProps(w http.ResponseWriter, r *http.Request) {
	run.WriteError(w, notSupported("This server does not support changing global properties. Start it with `--props`"))
}

// props is GET /props: what llama-server reports of itself that this
// engine has (the template and BOS/EOS as the backend reports them).
func (a *api) props(w http.ResponseWriter, r *http.Request) {
	_, info := a.s.Backend()
	tun := a.s.Tunables()
	sp := tun.Sampler()
	run.WriteJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{
			"n_ctx": info.SlotCtx(),
			"params": map[string]any{"n_predict": tun.NPredict(), "temperature": sp.Temperature, "top_k": sp.TopK,
				"top_p": sp.TopP, "min_p": sp.MinP, "seed": sp.Seed, "repeat_penalty": sp.RepeatPenalty, "repeat_last_n": sp.RepeatLastN,
				"presence_penalty": sp.PresencePenalty, "frequency_penalty": sp.FrequencyPenalty, "ignore_eos": sp.IgnoreEOS},
		},
		"total_slots":   info.NSlots,
		"model_alias":   info.Model.Alias,
		"model_path":    info.Model.Path,
		"modalities":    map[string]bool{"vision": false, "video": false, "audio": false},
		"build_info":    fingerprint(info),
		"is_sleeping":   false,
		"chat_template": info.ChatTemplate,
		"bos_token":     info.BOSToken,
		"eos_token":     info.EOSToken,
	})
}

// readJSON reads a small request body into v.
func (a *api) readJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		return err
	}
	return run.DecodeJSON(body, v)
}

// backendTokenize asks the backend, answering the error itself (false).
func (a *api) backendTokenize(w http.ResponseWriter, r *http.Request, req iface.PrefillRequest) (iface.Prompt, bool) {
	b, _ := a.s.Backend()
	p, err := b.Tokenize(r.Context(), req)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "tokenizing", err))
		return p, false
	}
	return p, true
}

func nonNil(t []int32) []int32 {
	if t == nil {
		return []int32{}
	}
	return t
}
