package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/native"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// nativeCompletion serves POST /completion.
func (a *api) nativeCompletion(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	a.completeNative(w, r, body, arrived)
}

// completeNative runs the native completion of body, which arrived then: a
// /completion body, or one built for it (/infill). Its completions run one
// after another into one reply, which the first that fails ends.
func (a *api) completeNative(w http.ResponseWriter, r *http.Request, body []byte, arrived time.Time) {
	_, info := a.s.Backend()
	tun := a.s.Tunables()
	cs, err := native.Convert(body, tun.Sampler(), tun.NPredict(), info)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	reply := native.NewReply(w, len(cs))
	for _, c := range cs {
		s := reply.Sink(c)
		a.runCompletion(w, r, c.Request, arrived, s)
		if !s.Done() || r.Context().Err() != nil {
			return
		}
	}
	reply.Finish()
}
