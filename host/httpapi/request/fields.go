package request

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// openAIStops is OpenAI's limit on stop strings; llama-server's native
// /completion takes any number.
const openAIStops = 4

// ReadStops reads "stop": a string or an array of strings, at most max of
// them (0: any number), empty ones dropped.
func ReadStops(raw json.RawMessage, max int) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop must be a string or an array of strings")
	}
	if max > 0 && len(many) > max {
		return nil, badRequest("stop takes at most %d strings, got %d", max, len(many))
	}
	return slices.DeleteFunc(many, func(s string) bool { return s == "" }), nil
}

// parseLogitBias reads logit_bias: OpenAI's object of token id → bias, or
// llama-server's [[id, bias], …] (a bias of false bans the token). A bias is
// clamped to OpenAI's [-100, 100], which is already a ban or a certainty.
func parseLogitBias(raw json.RawMessage, nVocab int) (map[int32]float32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	out := map[int32]float32{}
	add := func(id int64, bias float64) error {
		if id < 0 || (nVocab > 0 && id >= int64(nVocab)) || id > math.MaxInt32 {
			return badRequest("logit_bias: token %d is outside the vocabulary", id)
		}
		if math.IsNaN(bias) {
			return badRequest("logit_bias: bias of token %d is not a number", id)
		}
		out[int32(id)] = float32(min(max(bias, -100), 100))
		return nil
	}
	var obj map[string]float64
	if json.Unmarshal(raw, &obj) == nil {
		for k, v := range obj {
			id, err := strconv.ParseInt(k, 10, 64)
			if err != nil {
				return nil, badRequest("logit_bias: key %q is not a token id", k)
			}
			if err := add(id, v); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	var pairs [][2]json.RawMessage
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, badRequest("logit_bias must be an object of token id to bias, or [[id, bias], …]")
	}
	for _, p := range pairs {
		var id int64
		if err := json.Unmarshal(p[0], &id); err != nil {
			return nil, badRequest("logit_bias: %s is not a token id", p[0])
		}
		bias := -math.MaxFloat64 // false: never this token
		if string(p[1]) != "false" {
			if err := json.Unmarshal(p[1], &bias); err != nil {
				return nil, badRequest("logit_bias: the bias of token %d must be a number or false", id)
			}
		}
		if err := add(id, bias); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// parseSlot reads id_slot: absent or -1 is any idle slot (-1).
func parseSlot(v *int64) (int, error) {
	if v == nil || *v == -1 {
		return -1, nil
	}
	if *v < 0 || *v > math.MaxInt32 {
		return -1, badRequest("id_slot %d is not a slot id", *v)
	}
	return int(*v), nil
}
