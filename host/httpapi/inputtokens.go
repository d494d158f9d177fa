package httpapi

import (
	"net/http"

	"github.com/hydra-engine/hydra-engine/host/httpapi/anthropic"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/responses"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// The prompt's token count of a request, without running it:
// POST /v1/chat/completions/input_tokens (a chat completion body),
// POST /v1/responses/input_tokens (a Responses body) and
// POST /v1/messages/count_tokens (a Messages body), as llama-server's
// handle_count_tokens answers them: the body rendered as its completion
// renders it, then the backend's Tokenize.

// chatInputTokens serves /v1/chat/completions/input_tokens.
func (a *api) chatInputTokens(w http.ResponseWriter, r *http.Request) {
	a.openAIInputTokens(w, r, func(body []byte, info iface.BackendInfo) (request.Body, error) {
		return request.Decode(body, true, info)
	})
}

// responsesInputTokens serves /v1/responses/input_tokens: the prompt a
// /v1/responses of the body renders.
func (a *api) responsesInputTokens(w http.ResponseWriter, r *http.Request) {
	a.openAIInputTokens(w, r, func(body []byte, info iface.BackendInfo) (request.Body, error) {
		chat, _, err := responses.Convert(body)
		if err != nil {
			return request.Body{}, err
		}
		return chat.Decode(info)
	})
}

// openAIInputTokens answers OpenAI's input_tokens object for the chat
// completion body toChat reads of the request's body.
func (a *api) openAIInputTokens(w http.ResponseWriter, r *http.Request, toChat func([]byte, iface.BackendInfo) (request.Body, error)) {
	body, err := readAdmittedBody(w, r, a.s)
	b, info := a.s.Backend()
	var req request.Body
	if err == nil {
		req, err = toChat(body, info)
	}
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	n, err := a.countPrompt(r, b, info, req)
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
	b, info := a.s.Backend()
	chat, _, err := anthropic.Convert(body, true)
	if err != nil {
		fail("reading the request", err)
		return
	}
	req, err := chat.Decode(info)
	if err != nil {
		fail("counting the prompt's tokens", err)
		return
	}
	n, err := a.countPrompt(r, b, info, req)
	if err != nil {
		fail("counting the prompt's tokens", err)
		return
	}
	run.WriteJSON(w, http.StatusOK, map[string]any{"input_tokens": n})
}

// countPrompt is the number of tokens the chat body's prompt renders to on
// backend b.
func (a *api) countPrompt(r *http.Request, b iface.Backend, info iface.BackendInfo, req request.Body) (int, error) {
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
