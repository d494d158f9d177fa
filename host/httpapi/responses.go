package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/responses"
)

// responses serves POST /v1/responses: the body converted, run as a chat
// completion whose events responses.Sink writes as a Response.
func (a *api) responses(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	sink := responses.NewSink(w)
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		sink.Fail(a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	chat, rb, err := responses.Convert(body)
	if err != nil {
		sink.Fail(a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	if rb.User != "" || rb.SafetyIdentifier != "" || len(rb.Metadata) > 0 {
		a.log.Debug("Responses request", "user", rb.User, "safety_identifier", rb.SafetyIdentifier, "metadata", rb.Metadata)
	}
	c, e := a.readCompletion(r.Context(), chatParser(chat))
	if e != nil {
		sink.Fail(e)
		return
	}
	a.runCompletion(w, r, c, arrived, sink)
}
