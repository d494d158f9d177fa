package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/openai"
	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

func (a *api) chatCompletions(w http.ResponseWriter, r *http.Request) { a.complete(w, r, true) }
func (a *api) textCompletions(w http.ResponseWriter, r *http.Request) { a.complete(w, r, false) }

// complete serves an OpenAI chat or text completion: the body converted,
// run as a completion whose events openai.Sink writes as OpenAI's reply.
// Until the decode starts streaming, a failure is the reply; after that it
// is a final error event.
func (a *api) complete(w http.ResponseWriter, r *http.Request, chat bool) {
	arrived := time.Now()
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	c, e := a.readCompletion(r.Context(), func(sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) (request.Completion, error) {
		return openai.Convert(body, chat, sampler, nPredict, info)
	})
	if e != nil {
		run.WriteError(w, e)
		return
	}
	a.runCompletion(w, r, c, arrived, openai.NewSink(w, c))
}
