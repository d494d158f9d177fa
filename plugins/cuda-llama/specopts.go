package cudallama

import (
	"fmt"
	"strconv"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Options of speculative decoding, named after llama-server's flags at the
// pinned commit (--spec-draft-model, --spec-draft-n-max, -n-min, -p-min,
// --spec-draft-ngl); without draft_model there is none.
const (
	OptDraftModel      = "draft_model"        // GGUF of the draft model, same vocabulary as the target
	OptDraftMax        = "draft_max"          // most tokens a slot drafts a step (llama-server's default 3)
	OptDraftMin        = "draft_min"          // a shorter draft is not verified (default 0)
	OptDraftPMin       = "draft_p_min"        // the draft stops at a token the draft model gives less (default 0)
	OptDraftNGPULayers = "draft_n_gpu_layers" // the draft model's layers on the GPU; -1 all (default)
	// OptDraftBatchMax is the most tokens one step's decoders verify in all
	// (ours, no llama-server flag): each slot's draft is at most its share
	// less the token it samples, so drafting shrinks as the batch grows and
	// stops beyond batchMax/2 decoders.
	OptDraftBatchMax = "draft_batch_max"
)

// specOptions are the parsed speculative-decoding options.
type specOptions struct {
	draftModel string
	draftNGPU  int
	draftPMin  float32
	specRule   specRule
}

func defaultSpecOptions() specOptions {
	return specOptions{draftNGPU: -1, specRule: specRule{nMax: 3, batchMax: 32}}
}

func init() {
	optionParsers[OptDraftModel] = nonEmptyField(func(o *options) *string { return &o.draftModel })
	optionParsers[OptDraftMax] = intField(func(o *options) *int { return &o.specRule.nMax }, 1, 256)
	optionParsers[OptDraftMin] = intField(func(o *options) *int { return &o.specRule.nMin }, 0, 256)
	optionParsers[OptDraftBatchMax] = intField(func(o *options) *int { return &o.specRule.batchMax }, 2, 1<<16)
	optionParsers[OptDraftNGPULayers] = intField(func(o *options) *int { return &o.draftNGPU }, -1, 1<<16)
	optionParsers[OptDraftPMin] = func(o *options, key, v string) error {
		p, err := strconv.ParseFloat(v, 32)
		if err != nil || p < 0 || p > 1 {
			return fmt.Errorf("%w: %s=%q: a probability in [0, 1]", iface.ErrBadRequest, key, v)
		}
		o.draftPMin = float32(p)
		return nil
	}
}

// checkSpec refuses draft options that contradict each other.
func (o specOptions) checkSpec() error {
	if o.specRule.nMin > o.specRule.nMax {
		return fmt.Errorf("%w: %s=%d above %s=%d", iface.ErrBadRequest, OptDraftMin, o.specRule.nMin, OptDraftMax, o.specRule.nMax)
	}
	return nil
}
