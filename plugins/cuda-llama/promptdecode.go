//go:build llama && cgo

package cudallama

import (
	"context"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/kv"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/sched"
)

// promptDecode is a Decode with a prompt (DecodeRequest.Prompt): one
// scheduler job prefills it and decodes on, so the step that evaluates the
// prompt's last token samples the first one and the decoder is in the next
// step. As two calls the decode would register only after the caller heard
// of the prefill, when the scheduler has started the next step (with other
// prompts in it, a long one) without it. On any failure before the first
// token the slot is left empty, as by Prefill.
func (b *Backend) promptDecode(ctx context.Context, e *engine, s *kv.Slot, req iface.DecodeRequest, out *outputRun, emit func(iface.Token) error) (iface.DecodeResult, error) {
	start := time.Now()
	p := *req.Prompt
	p.Slot = req.Slot
	if req.NPredict == 0 {
		return b.promptOnly(ctx, p, start)
	}
	toks, _, err := e.promptTokens(p)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	smp, err := newSampler(e.model, req.Sampler, req.NProbs, e.cells.SlotCtx, toks)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	if err := out.attach(e.model, smp); err != nil {
		smp.free()
		return iface.DecodeResult{}, err
	}
	if err := s.Acquire(req.Slot); err != nil {
		smp.free()
		return iface.DecodeResult{}, err
	}
	defer s.Release()
	e.fromCache(ctx, req.Slot, s, toks, p)
	d := sched.NewDecode(req, smp, len(toks))
	j, reused, err := e.startPrefill(req.Slot, s, toks, e.spansOf(p, toks), d)
	if err != nil {
		smp.free()
		return iface.DecodeResult{}, err
	}
	defer e.updateStateSize(req.Slot, s)
	res, err := e.streamDecode(ctx, j, smp, emit) // frees the sampler
	if d.Prompted.IsZero() {                      // the prompt failed or was cancelled: no tokens, the slot is empty
		return iface.DecodeResult{}, err
	}
	res.Prompt = &iface.PromptResult{NTokens: len(toks), Reused: reused,
		ModelFallback: b.modelFallback(e, p), Prefill: d.Prompted.Sub(start)}
	return res, err
}

// promptOnly is a Decode of no tokens with a prompt: the prompt's prefill.
func (b *Backend) promptOnly(ctx context.Context, p iface.PrefillRequest, start time.Time) (iface.DecodeResult, error) {
	pres, err := b.Prefill(ctx, p)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	return iface.DecodeResult{NPast: pres.Slot.NPast, StopReason: StopLength, Prompt: pres.PromptResult(time.Since(start))}, nil
}
