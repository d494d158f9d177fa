package main

import "strconv"

// Speculative decoding, configured alike on ours (plugin options) and on
// llama-server (its --spec-* flags at the pinned commit), so that a run with
// -draft-model compares the two with the same draft and a run without it is
// both systems' baseline.

// specOurs is ours' backend options for the draft settings.
func specOurs(o options) []string {
	var kv []string
	if o.draftModel != "" {
		kv = append(kv, "draft_model="+o.draftModel)
	}
	if o.specType != "" {
		kv = append(kv, "spec_type="+o.specType)
	}
	if !o.speculating() {
		return kv
	}
	if o.draftMax > 0 {
		kv = append(kv, "draft_max="+strconv.Itoa(o.draftMax))
	}
	if o.draftMin >= 0 {
		kv = append(kv, "draft_min="+strconv.Itoa(o.draftMin))
	}
	if o.draftPMin != "" {
		kv = append(kv, "draft_p_min="+o.draftPMin)
	}
	if o.draftModel != "" {
		kv = append(kv, "draft_n_gpu_layers="+strconv.Itoa(o.ngl))
	}
	return kv
}

// specLlamaServer is llama-server's flags for the same settings.
func specLlamaServer(o options) []string {
	var a []string
	if o.draftModel != "" {
		a = append(a, "-md", o.draftModel, "-ngld", strconv.Itoa(llamaServerLayers(o.ngl)))
	}
	switch {
	case o.specType != "":
		a = append(a, "--spec-type", o.specType)
	case o.draftModel != "":
		// At the pinned tree llama-server loads -md but drafts only with a
		// --spec-type naming it ("no implementations specified"); ours
		// takes draft-simple for a draft model unasked.
		a = append(a, "--spec-type", "draft-simple")
	}
	if !o.speculating() {
		return a
	}
	if o.draftMax > 0 {
		a = append(a, "--spec-draft-n-max", strconv.Itoa(o.draftMax))
	}
	if o.draftMin >= 0 {
		a = append(a, "--spec-draft-n-min", strconv.Itoa(o.draftMin))
	}
	if o.draftPMin != "" {
		a = append(a, "--spec-draft-p-min", o.draftPMin)
	}
	return a
}

func (o options) speculating() bool { return o.draftModel != "" || o.specType != "" }
