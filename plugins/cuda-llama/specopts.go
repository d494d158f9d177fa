package cudallama

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/specrule"
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
	// OptSpecType is llama-server's --spec-type: a comma-separated list of
	// draft-simple (the draft model's; the default with draft_model),
	// draft-mtp (the model's own multi-token-prediction block: a qwen35moe
	// that carries one), ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod (the n-gram
	// lookups of a slot's own tokens, llama.cpp's defaults), the first that
	// drafts for a slot serving it that step.
	OptSpecType = "spec_type"
	// The n-gram sizes, as llama-server's --spec-ngram-simple-size-n/-m and
	// --spec-ngram-map-k-size-n/-m (these for ngram-map-k4v too): the
	// n-gram looked up and the m-gram after it drafted; unset, llama.cpp's
	// defaults (12 and 48).
	OptSpecNgramSimpleSizeN = "spec_ngram_simple_size_n"
	OptSpecNgramSimpleSizeM = "spec_ngram_simple_size_m"
	OptSpecNgramMapSizeN    = "spec_ngram_map_k_size_n"
	OptSpecNgramMapSizeM    = "spec_ngram_map_k_size_m"
	// OptDraftBatchMax is the most tokens one step's decoders verify in all
	// (ours, no llama-server flag): the drafts and each decoder's pending
	// token.
	OptDraftBatchMax = "draft_batch_max"
	// OptDraftRule is how a step's drafts are chosen (ours, no llama-server
	// flag): "measured" (the default) drafts only where, by the step times
	// measured on this device and each slot's acceptance, a step with
	// drafts brings more tokens a second than one without, and probes now
	// and then where it does not; "always" drafts each slot's most every
	// step, as llama-server does, each slot's share of draft_batch_max.
	OptDraftRule = "draft_rule"
)

// Draft rules (OptDraftRule).
const (
	DraftRuleMeasured = "measured"
	DraftRuleAlways   = "always"
)

// specOptions are the parsed speculative-decoding options.
type specOptions struct {
	ngramSimple, ngramMap [2]int   // size n, size m; 0: llama.cpp's
	specTypes             []string // none: no speculative decoding
	draftModel            string
	draftNGPU             int
	draftPMin             float32
	specBounds            specrule.Bounds
	draftAlways           bool // draft_rule=always
}

func defaultSpecOptions() specOptions {
	return specOptions{draftNGPU: -1, specBounds: specrule.Bounds{NMax: 3, BatchMax: 32}}
}

// specParsers are the options of this file, merged into optionParsers.
var specParsers = map[string]optionParser{
	OptDraftModel:           nonEmptyField(func(o *options) *string { return &o.draftModel }),
	OptDraftMax:             intField(func(o *options) *int { return &o.specBounds.NMax }, 1, 256),
	OptDraftMin:             intField(func(o *options) *int { return &o.specBounds.NMin }, 0, 256),
	OptDraftBatchMax:        intField(func(o *options) *int { return &o.specBounds.BatchMax }, 2, 1<<16),
	OptDraftNGPULayers:      intField(func(o *options) *int { return &o.draftNGPU }, -1, 1<<16),
	OptSpecType:             parseSpecType,
	OptSpecNgramSimpleSizeN: intField(func(o *options) *int { return &o.ngramSimple[0] }, 1, 1024),
	OptSpecNgramSimpleSizeM: intField(func(o *options) *int { return &o.ngramSimple[1] }, 1, 1024),
	OptSpecNgramMapSizeN:    intField(func(o *options) *int { return &o.ngramMap[0] }, 1, 1024),
	OptSpecNgramMapSizeM:    intField(func(o *options) *int { return &o.ngramMap[1] }, 1, 1024),
	OptDraftPMin:            parseDraftPMin,
	OptDraftRule:            parseDraftRule,
}

// draftRule is draft_rule's value.
func (o *specOptions) draftRule() string {
	if o.draftAlways {
		return DraftRuleAlways
	}
	return DraftRuleMeasured
}

// parseDraftRule reads draft_rule.
func parseDraftRule(o *options, key, v string) error {
	switch v {
	case DraftRuleMeasured, DraftRuleAlways:
		o.draftAlways = v == DraftRuleAlways
		return nil
	}
	return fmt.Errorf("%w: %s=%q: %s or %s", iface.ErrBadRequest, key, v, DraftRuleMeasured, DraftRuleAlways)
}

// parseSpecType reads spec_type's comma-separated names, each once.
func parseSpecType(o *options, key, v string) error {
	o.specTypes = nil
	for t := range strings.SplitSeq(v, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(specTypeNames, t) {
			return fmt.Errorf("%w: %s=%q: %q is not one of %s", iface.ErrBadRequest, key, v, t, strings.Join(specTypeNames, ", "))
		}
		if !slices.Contains(o.specTypes, t) {
			o.specTypes = append(o.specTypes, t)
		}
	}
	return nil
}

// parseDraftPMin reads draft_p_min, a probability.
func parseDraftPMin(o *options, key, v string) error {
	p, err := strconv.ParseFloat(v, 32)
	if err != nil || p < 0 || p > 1 {
		return fmt.Errorf("%w: %s=%q: a probability in [0, 1]", iface.ErrBadRequest, key, v)
	}
	o.draftPMin = float32(p)
	return nil
}

// specTypeNames are the spec_type names the plugin runs: llama.cpp's,
// less those that need a model of their own kind (eagle3, dflash, dspark)
// or lookup files (ngram-cache).
var specTypeNames = []string{"draft-simple", specMTP, "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod"}

// specMTP is spec_type's draft-mtp.
const specMTP = "draft-mtp"

// checkSpec resolves spec_type's default (draft-simple with a draft_model)
// and refuses options that contradict each other.
func (o *specOptions) checkSpec() error {
	if o.specBounds.NMin > o.specBounds.NMax {
		return fmt.Errorf("%w: %s=%d above %s=%d", iface.ErrBadRequest, OptDraftMin, o.specBounds.NMin, OptDraftMax, o.specBounds.NMax)
	}
	simple := slices.Contains(o.specTypes, "draft-simple")
	switch {
	case o.draftModel != "" && o.specTypes == nil:
		o.specTypes = []string{"draft-simple"}
	case o.draftModel != "" && !simple:
		return fmt.Errorf("%w: %s is set but %s=%s leaves out draft-simple, which uses it", iface.ErrBadRequest,
			OptDraftModel, OptSpecType, strings.Join(o.specTypes, ","))
	case o.draftModel == "" && simple:
		return fmt.Errorf("%w: %s=draft-simple needs %s", iface.ErrBadRequest, OptSpecType, OptDraftModel)
	case simple && o.mtp():
		// llama.cpp's draft-simple and draft-mtp each take the one draft context.
		return fmt.Errorf("%w: %s=draft-mtp drafts with the model's own MTP block and takes no %s; leave out draft-simple and %s",
			iface.ErrBadRequest, OptSpecType, OptDraftModel, OptDraftModel)
	}
	return nil
}

// mtp says whether the model's MTP block drafts (draft-mtp).
func (o *specOptions) mtp() bool { return slices.Contains(o.specTypes, specMTP) }

// requestBounds reads a request's own bounds (llama-server's
// speculative.n_max, n_min): its n_max (0: the rule's own) and n_min (0:
// the load's draft_min), and whether it turns drafting off (n_max 0).
func requestBounds(p *iface.SpeculativeParams) (nMax, nMin int, off bool) {
	if p == nil {
		return 0, 0, false
	}
	if p.NMax == 0 {
		return 0, 0, true
	}
	return max(p.NMax, 0), max(p.NMin, 0), false
}
