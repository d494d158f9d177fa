// Package tokenin builds the token ids of llama-server's inputs as its
// tools/server/server-common.cpp builds them (tokenize_mixed,
// tokenize_input_prompts): texts tokenized by a Tokenizer with
// llama-server's add_special and parse_special for each, token ids taken
// as they are. The embeddings, rerank and infill routes share it.
package tokenin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// Tokenizer is the backend's tokenizer: common_tokenize of text, BOS/EOS
// added as the vocabulary adds them with addSpecial, special tokens' text
// read as them with parseSpecial; an empty text without addSpecial has no
// tokens.
type Tokenizer interface {
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error)
}

// JSONValue decodes raw keeping numbers as written, so that an integer
// (a token id) is told from a fraction as llama-server's JSON library
// tells them.
func JSONValue(raw json.RawMessage) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// tokenID is v as a token id when it is a JSON integer: a number written
// without a fraction or exponent. ok is false for anything else; an
// integer no token can have is refused.
func tokenID(v any) (id int32, ok bool, err error) {
	n, isNum := v.(json.Number)
	if !isNum || strings.ContainsAny(string(n), ".eE") {
		return 0, false, nil
	}
	i, perr := n.Int64()
	if perr != nil || i < 0 || i > math.MaxInt32 {
		return 0, true, fmt.Errorf("%s is not a token id", n)
	}
	return int32(i), true, nil
}

// fieldBadRequest is a 400 whose param is path, the value at fault
// (input[2].prompt_string).
func fieldBadRequest(path, format string, args ...any) *run.Error {
	e := run.BadRequest(format, args...)
	e.Param = path
	return e
}

// isTokenID reports whether v is a JSON integer.
func isTokenID(v any) bool {
	_, ok, _ := tokenID(v)
	return ok
}

// Mixed is tokenize_mixed: a text, or an array of texts and token ids
// joined, only the first element given addSpecial. field names the value
// in errors.
func Mixed(t Tokenizer, v any, field string, addSpecial, parseSpecial bool) ([]int32, error) {
	switch x := v.(type) {
	case string:
		return t.Tokenize(x, addSpecial, parseSpecial)
	case []any:
		var out []int32
		for i, e := range x {
			if s, isText := e.(string); isText {
				toks, err := t.Tokenize(s, addSpecial && i == 0, parseSpecial)
				if err != nil {
					return nil, err
				}
				out = append(out, toks...)
				continue
			}
			id, ok, err := tokenID(e)
			switch {
			case err != nil:
				return nil, fieldBadRequest(fmt.Sprintf("%s[%d]", field, i), "%s[%d]: %v", field, i, err)
			case !ok:
				return nil, fieldBadRequest(fmt.Sprintf("%s[%d]", field, i), "%s[%d] must be a string or a token id", field, i)
			}
			out = append(out, id)
		}
		return out, nil
	}
	return nil, fieldBadRequest(field, "%s must be a string or an array of strings and token ids", field)
}

// InputPrompts is tokenize_input_prompts: an array without token ids is
// several prompts, anything else one; a prompt is a text, token ids, texts
// and token ids mixed, or {"prompt_string": …}. field names the value in
// errors.
func InputPrompts(t Tokenizer, v any, field string, addSpecial, parseSpecial bool) ([][]int32, error) {
	arr, isArray := v.([]any)
	if !isArray || containsTokenID(arr) {
		p, err := subprompt(t, v, field, addSpecial, parseSpecial)
		return [][]int32{p}, err
	}
	if len(arr) == 0 {
		return nil, fieldBadRequest(field, "%s must not be empty", field)
	}
	out := make([][]int32, len(arr))
	for i, e := range arr {
		var err error
		if out[i], err = subprompt(t, e, fmt.Sprintf("%s[%d]", field, i), addSpecial, parseSpecial); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func containsTokenID(arr []any) bool {
	for _, e := range arr {
		if isTokenID(e) {
			return true
		}
	}
	return false
}

// subprompt is tokenize_input_subprompt of one prompt.
func subprompt(t Tokenizer, v any, field string, addSpecial, parseSpecial bool) ([]int32, error) {
	switch x := v.(type) {
	case string:
		return t.Tokenize(x, addSpecial, parseSpecial)
	case []any:
		if mixedTextAndIDs(x) {
			return Mixed(t, x, field, addSpecial, parseSpecial)
		}
		out := make([]int32, len(x))
		for i, e := range x {
			id, ok, err := tokenID(e)
			switch {
			case err != nil:
				return nil, fieldBadRequest(fmt.Sprintf("%s[%d]", field, i), "%s[%d]: %v", field, i, err)
			case !ok:
				return nil, fieldBadRequest(field, "%s must be a string, an array of token ids, an array of strings and token ids, or {\"prompt_string\": …}", field)
			}
			out[i] = id
		}
		return out, nil
	case map[string]any:
		if _, ok := x["multimodal_data"]; ok {
			return nil, fieldBadRequest(field+".multimodal_data", "%s.multimodal_data: this model takes no images or audio", field)
		}
		if ps, ok := x["prompt_string"]; ok {
			return Mixed(t, ps, field+".prompt_string", addSpecial, parseSpecial)
		}
	}
	return nil, fieldBadRequest(field, "%s must be a string, an array of token ids, an array of strings and token ids, or {\"prompt_string\": …}", field)
}

// mixedTextAndIDs is json_is_array_of_mixed_numbers_strings: the array holds
// both a text and a token id.
func mixedTextAndIDs(arr []any) bool {
	text, id := false, false
	for _, e := range arr {
		_, isText := e.(string)
		text = text || isText
		id = id || isTokenID(e)
		if text && id {
			return true
		}
	}
	return false
}
