package tokenin

import (
	"errors"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
)

// byteTokens tokenizes a text as its bytes, 1 first with addSpecial.
type byteTokens struct{}

func (byteTokens) Tokenize(s string, addSpecial, parseSpecial bool) ([]int32, error) {
	var out []int32
	if addSpecial {
		out = append(out, 1)
	}
	for _, c := range []byte(s) {
		out = append(out, int32(c))
	}
	return out, nil
}

// TestInputPrompts: tokenize_input_prompts' prompts (a text, token ids,
// both mixed, prompt_string, several), addSpecial on each prompt's first
// text only, and the 400s naming the value at fault.
func TestInputPrompts(t *testing.T) {
	for _, c := range []struct {
		json  string
		want  [][]int32
		err   string
		param string
	}{
		{`"ab"`, [][]int32{{1, 'a', 'b'}}, "", ""},
		{`[5, 6]`, [][]int32{{5, 6}}, "", ""},
		{`["a", 5, "b"]`, [][]int32{{1, 'a', 5, 'b'}}, "", ""},
		{`["a", "b"]`, [][]int32{{1, 'a'}, {1, 'b'}}, "", ""},
		{`{"prompt_string": "a"}`, [][]int32{{1, 'a'}}, "", ""},
		{`[]`, nil, "input must not be empty", "input"},
		{`[5, -1]`, nil, "input[1]: -1 is not a token id", "input[1]"},
		{`[5, 1.5]`, nil, `input must be a string, an array of token ids, an array of strings and token ids, or {"prompt_string": …}`, "input"},
		{`{"multimodal_data": []}`, nil, "input.multimodal_data: this model takes no images or audio", "input.multimodal_data"},
	} {
		v, err := JSONValue([]byte(c.json))
		if err != nil {
			t.Fatal(err)
		}
		got, err := InputPrompts(byteTokens{}, v, "input", true, true)
		if c.err != "" {
			var e *run.Error
			if !errors.As(err, &e) || e.Msg != c.err || e.Param != c.param {
				t.Errorf("%s: %#v, want %q (param %s)", c.json, err, c.err, c.param)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.json, got, err, c.want)
		}
	}
}
