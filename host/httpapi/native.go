package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/native"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// nativeCompletion serves POST /completion.
func (a *api) nativeCompletion(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	body, err := readAdmittedBody(w, r, a.s)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(r.Context(), "reading the request", err))
		return
	}
	a.completeNative(w, r, arrived, func(sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) ([]native.Completion, error) {
		return native.Convert(body, sampler, nPredict, info)
	})
}

// completeNative runs the native completions convert makes over the
// engine's sampler and nPredict defaults (of a /completion or /infill body),
// whose request arrived then. They run one after another into one reply,
// which the first that fails ends.
func (a *api) completeNative(w http.ResponseWriter, r *http.Request, arrived time.Time,
	convert func(iface.SamplerParams, int, iface.BackendInfo) ([]native.Completion, error)) {
	_, info := a.s.Backend()
	tun := a.s.Tunables()
	cs, err := convert(tun.Sampler(), tun.NPredict(), info)
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
