package host

import (
	"fmt"
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// SamplerFields are the sampler keys a request may set: CONFIGURE (the
// engine's defaults), DECODE and the HTTP completions (one request). nil
// means not given. Seeds and logit biases are read by each caller, as their
// forms differ (HTTP's seed -1 asks for a random one).
type SamplerFields struct {
	Temperature      *float64 `json:"temperature" mapstructure:"temperature"`
	TopK             *int64   `json:"top_k" mapstructure:"top_k"`
	TopP             *float64 `json:"top_p" mapstructure:"top_p"`
	MinP             *float64 `json:"min_p" mapstructure:"min_p"`
	RepeatPenalty    *float64 `json:"repeat_penalty" mapstructure:"repeat_penalty"`
	RepeatLastN      *int64   `json:"repeat_last_n" mapstructure:"repeat_last_n"`
	PresencePenalty  *float64 `json:"presence_penalty" mapstructure:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty" mapstructure:"frequency_penalty"`
	IgnoreEOS        *bool    `json:"ignore_eos" mapstructure:"ignore_eos"`
}

// maxSamplerValue bounds the temperature and the penalties: far beyond any
// useful value, and well inside the float32 the backends compute in, so no
// value a client sends becomes an infinity there.
const maxSamplerValue = 1e6

// Validate checks every field given in the type and range it is used in,
// naming the first that is out of range. nCtx bounds repeat_last_n (the
// penalties' window is allocated per sequence); 0 means not known yet (the
// backend clamps the window to its context itself).
func (f SamplerFields) Validate(nCtx int) error {
	switch {
	case f.Temperature != nil && !(*f.Temperature >= 0 && *f.Temperature <= maxSamplerValue):
		return fmt.Errorf("temperature must be in [0, %g], got %v", float64(maxSamplerValue), *f.Temperature)
	case f.TopK != nil && (*f.TopK < 0 || *f.TopK > math.MaxInt32):
		return fmt.Errorf("top_k must be in [0, %d], got %d", math.MaxInt32, *f.TopK)
	case f.TopP != nil && !(*f.TopP > 0 && *f.TopP <= 1):
		return fmt.Errorf("top_p must be in (0, 1], got %v", *f.TopP)
	case f.MinP != nil && !(*f.MinP >= 0 && *f.MinP <= 1):
		return fmt.Errorf("min_p must be in [0, 1], got %v", *f.MinP)
	case f.RepeatPenalty != nil && !(*f.RepeatPenalty >= 0 && *f.RepeatPenalty <= maxSamplerValue):
		return fmt.Errorf("repeat_penalty must be in [0, %g], got %v", float64(maxSamplerValue), *f.RepeatPenalty)
	case f.RepeatLastN != nil && (*f.RepeatLastN < -1 || *f.RepeatLastN > int64(maxRepeatLastN(nCtx))):
		return fmt.Errorf("repeat_last_n must be -1 (the whole sequence) or in [0, %d]%s, got %d",
			maxRepeatLastN(nCtx), ctxNote(nCtx), *f.RepeatLastN)
	case f.PresencePenalty != nil && !(math.Abs(*f.PresencePenalty) <= maxSamplerValue):
		return fmt.Errorf("presence_penalty must be in [-%g, %g], got %v", float64(maxSamplerValue), float64(maxSamplerValue), *f.PresencePenalty)
	case f.FrequencyPenalty != nil && !(math.Abs(*f.FrequencyPenalty) <= maxSamplerValue):
		return fmt.Errorf("frequency_penalty must be in [-%g, %g], got %v", float64(maxSamplerValue), float64(maxSamplerValue), *f.FrequencyPenalty)
	}
	return nil
}

// maxRepeatLastN is the longest penalty window: the context when known, since
// no sequence is longer and the backend allocates the window.
func maxRepeatLastN(nCtx int) int {
	if nCtx > 0 {
		return nCtx
	}
	return math.MaxInt32
}

func ctxNote(nCtx int) string {
	if nCtx > 0 {
		return " (the context)"
	}
	return ""
}

// Apply sets the fields given on p and returns them by key (for CONFIGURE's
// params_applied). Call Validate first.
func (f SamplerFields) Apply(p *iface.SamplerParams) map[string]any {
	applied := map[string]any{}
	setF := func(key string, v *float64, dst *float32) {
		if v != nil {
			*dst = float32(*v)
			applied[key] = *v
		}
	}
	setI := func(key string, v *int64, dst *int32) {
		if v != nil {
			*dst = int32(*v)
			applied[key] = *v
		}
	}
	setF("temperature", f.Temperature, &p.Temperature)
	setI("top_k", f.TopK, &p.TopK)
	setF("top_p", f.TopP, &p.TopP)
	setF("min_p", f.MinP, &p.MinP)
	setF("repeat_penalty", f.RepeatPenalty, &p.RepeatPenalty)
	setI("repeat_last_n", f.RepeatLastN, &p.RepeatLastN)
	setF("presence_penalty", f.PresencePenalty, &p.PresencePenalty)
	setF("frequency_penalty", f.FrequencyPenalty, &p.FrequencyPenalty)
	if f.IgnoreEOS != nil {
		p.IgnoreEOS = *f.IgnoreEOS
		applied["ignore_eos"] = *f.IgnoreEOS
	}
	return applied
}

// DefaultRepeatLastN is the look-back of the penalties when a request sets a
// penalty and no repeat_last_n, as llama-server's default.
const DefaultRepeatLastN = 64
