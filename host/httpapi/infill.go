package httpapi

import (
	"net/http"
	"time"

	"github.com/hydra-engine/hydra-engine/host/httpapi/native"
	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// infill serves llama-server's /infill: the body read and its FIM prompt
// built through the backend's tokenizer by package native, then run as
// the native completion it makes.
func (a *api) infill(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	ctx := r.Context()
	raw, b, info, e := a.bodyAndBackend(w, r)
	if e != nil {
		run.WriteError(w, e)
		return
	}
	if missing := native.FIMMissing(info.Special); missing != "" {
		run.WriteError(w, notSupported("Infill is not supported by this model: "+missing))
		return
	}
	in, err := native.ReadInfill(raw)
	if err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "reading the request", err))
		return
	}
	prompt, err := in.Prompt(textTokens{ctx: ctx, b: b}, *info.Special, native.InfillBudget{NBatch: infillBatch(info),
		NPredict: a.s.Tunables().NPredict(), NCtx: info.SlotCtx(), SPM: a.spmInfill})
	if err != nil {
		run.WriteError(w, a.apiErrorOf(ctx, "tokenizing the input", err))
		return
	}
	a.completeNative(w, r, arrived, func(sampler iface.SamplerParams, nPredict int, info iface.BackendInfo) ([]native.Completion, error) {
		return in.Convert(prompt, sampler, nPredict, info)
	})
}

// infillBatch is the n_batch infill's budget takes: the backend's, else
// llama-server's default.
func infillBatch(info iface.BackendInfo) int {
	if info.NBatch > 0 {
		return info.NBatch
	}
	return 2048
}
