package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/anthropic"
)

// messages serves POST /v1/messages: the body converted, run as a chat
// completion whose events anthropic.Sink writes as Anthropic's reply.
func (a *api) messages(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	sink := anthropic.NewSink(w)
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		sink.Fail(a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	chat, m, err := anthropic.Convert(body, false)
	if err != nil {
		sink.Fail(a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	if m.Metadata != nil && m.Metadata.UserID != "" {
		a.log.Debug("Anthropic messages request", "metadata.user_id", m.Metadata.UserID)
	}
	c, e := a.readCompletion(r.Context(), chatParser(chat))
	if e != nil {
		sink.Fail(e)
		return
	}
	a.runCompletion(w, r, c, arrived, sink)
}
