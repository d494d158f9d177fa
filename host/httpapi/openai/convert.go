// Package openai is OpenAI's chat and text completions (POST
// /v1/chat/completions, /v1/completions) as llama-server serves them:
// Convert reads a body into the run's request, and Sink writes the run's
// events as OpenAI's reply or its server-sent events.
package openai

import (
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/iface"
)

// Convert reads a chat (chat set) or text completion body into the
// completion it runs as, over the engine's sampler and nPredict defaults.
// OpenAI's body is the shape every dialect's request becomes, so this is
// request.Parse; a body it refuses gets a *run.Error naming the field at
// fault.
func Convert(body []byte, chat bool, sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (request.Completion, error) {
	return request.Parse(body, chat, sampler, nPredict, info)
}
