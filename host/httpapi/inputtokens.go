package httpapi

import (
	"net/http"

	"github.com/hydra-engine/hydra-engine/host/httpapi/anthropic"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/responses"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// The prompt's token count of a request, without running it:
// POST /v1/chat/completions/input_tokens (a chat completion body),
// POST /v1/responses/input_tokens (a Responses body) and
// POST /v1/messages/count_tokens (a Messages body), as llama-server's
// handle_count_tokens answers them: the body rendered as its completion
// renders it, then the backend's Tokenize.

// chatInputTokens serves /v1/chat/completions/input_tokens.
func (a *api) chatInputTokens(w http.ResponseWriter, r *http.Request) {
	a.openAIInputTokens(w, r, func(body []byte) ([]byte, error) { return body, nil })
}

// responsesInputTokens serves /v1/responses/input_tokens: the prompt a
// /v1/responses of the body renders.
func (a *api) responsesInputTokens(w http.ResponseWriter, r *http.Request) {
	a.openAIInputTokens(w, r, func(body []byte) ([]byte, error) {
		oai, _, err := responses.Convert(body)
		return oai, err
	})
}

// openAIInputTokens answers OpenAI's input_tokens object for the chat
// completion body toChat makes of the request's body.
func (a *api) openAIInputTokens(w http.ResponseWriter, r *http.Request, toChat func([]byte) ([]byte, error)) {
	body, err := readAdmittedBody(w, r, a.s)
	if err == nil {
		body, err = toChat(body)
	}
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	n, err := a.countPrompt(r, body)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "counting the prompt's tokens", err))
		return
	}
	run.WriteJSON(w, http.StatusOK, map[string]any{"object": "response.input_tokens", "input_tokens": n})
}

// countMessageTokens serves /v1/messages/count_tokens, errors in
// Anthropic's shape.
func (a *api) countMessageTokens(w http.ResponseWriter, r *http.Request) {
	fail := func(step string, err error) {
		e := a.apiErrorOf(r.Context(), step, err)
		anthropic.WriteError(w, e.Status, e.Msg)
	}
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		fail("reading the request", err)
		return
	}
	oai, _, err := anthropic.Convert(body, true)
	if err != nil {
		fail("reading the request", err)
		return
	}
	n, err := a.countPrompt(r, oai)
	if err != nil {
		fail("counting the prompt's tokens", err)
		return
	}
	run.WriteJSON(w, http.StatusOK, map[string]any{"input_tokens": n})
}

// countPrompt is the number of tokens the chat completion body's prompt
// renders to.
func (a *api) countPrompt(r *http.Request, body []byte) (int, error) {
	b, info := a.s.Backend()
	req, err := request.Decode(body, true, info)
	if err != nil {
		return 0, err
	}
	if err := a.checkModel(req.Model); err != nil {
		return 0, err
	}
	p, err := req.ChatPrefill(info)
	if err != nil {
		return 0, err
	}
	toks, err := b.Tokenize(r.Context(), p)
	if err != nil {
		return 0, err
	}
	return len(toks.Tokens), nil
}
