package native

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/run"
	"github.com/hydra-engine/hydra-engine/iface"
)

// The FIM tokens of the tests' vocabulary, the mock's: no BOS.
const (
	fPre, fSuf, fMid, fRep, fSep = 0x10, 0x11, 0x12, 0x14, 0x15
)

var testSpecial = iface.SpecialTokens{BOS: iface.NoToken, EOS: 2, SEP: iface.NoToken,
	FIMPre: fPre, FIMSuf: fSuf, FIMMid: fMid, FIMPad: 0x13, FIMRep: fRep, FIMSep: fSep}

func infillPieces() infillTokens {
	return infillTokens{prefix: []int32{1, 2, 3, 4, 5}, suffix: []int32{6, 7, 8}, prompt: []int32{9},
		repo: []int32{20, 21}, current: []int32{22}, snippet: []int32{30},
		extra: []extraTokens{{filename: []int32{40}, text: []int32{41, 42}}}}
}

func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestFormatInfill holds the prompt to format_prompt_infill's layout and
// budget: the repository context, prefix and prompt, suffix, middle; the
// prefix's last and the suffix's first tokens to fit a batch, the extra
// context's last tokens to what the context leaves; suffix first with spm;
// BOS where the vocabulary adds it; the snippet separator without FIM_SEP.
func TestFormatInfill(t *testing.T) {
	sp := testSpecial
	p := infillPieces()
	extra := []int32{fRep, 20, 21, fSep, 40, 41, 42, fSep, 22}
	for _, c := range []struct {
		name string
		sp   iface.SpecialTokens
		b    InfillBudget
		want []int32
	}{
		{"room for all", sp, InfillBudget{NBatch: 100, NPredict: 10, NCtx: 1000},
			cat(extra, []int32{fPre, 1, 2, 3, 4, 5, 9, fSuf, 6, 7, 8, fMid})},
		// n_batch 4: 3 of the prefix, none of the suffix (1 - (2 + 1) < 0);
		// the context leaves 10 - 4 - 2 of the extra context.
		{"tight", sp, InfillBudget{NBatch: 4, NPredict: 1, NCtx: 10},
			cat(extra[len(extra)-4:], []int32{fPre, 3, 4, 5, 9, fSuf, fMid})},
		// n_predict -1 (unbounded) leaves two more of the context.
		{"n_predict -1", sp, InfillBudget{NBatch: 4, NPredict: -1, NCtx: 4},
			cat(extra[len(extra)-2:], []int32{fPre, 3, 4, 5, 9, fSuf, fMid})},
		{"spm with BOS", func() iface.SpecialTokens { s := sp; s.BOS, s.AddBOS = 1, true; return s }(), InfillBudget{NBatch: 100, NCtx: 1000, SPM: true},
			cat(extra, []int32{1, fSuf, 6, 7, 8, fPre, 1, 2, 3, 4, 5, 9, fMid})},
		{"no FIM_REP, no FIM_SEP", func() iface.SpecialTokens { s := sp; s.FIMRep, s.FIMSep = iface.NoToken, iface.NoToken; return s }(),
			InfillBudget{NBatch: 100, NCtx: 1000}, []int32{30, 41, 42, fPre, 1, 2, 3, 4, 5, 9, fSuf, 6, 7, 8, fMid}},
	} {
		if got := formatInfill(c.sp, p, c.b); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeTokens tokenizes a text as its bytes, special tokens' text included
// (no text here holds one); a text "fail" fails.
type fakeTokens struct{}

func (fakeTokens) Tokenize(s string, addSpecial, parseSpecial bool) ([]int32, error) {
	if s == "fail" {
		return nil, errors.New("tokenizer failed")
	}
	var out []int32
	for _, c := range []byte(s) {
		out = append(out, int32(c))
	}
	return out, nil
}

func bytesOf(texts ...string) []int32 {
	var out []int32
	for _, s := range texts {
		out = append(out, fakeTokens{}.tokens(s)...)
	}
	return out
}

func (f fakeTokens) tokens(s string) []int32 {
	t, _ := f.Tokenize(s, false, false)
	return t
}

// TestInfillConvert: an /infill body is read, its prompt built through the
// tokenizer as format_prompt_infill builds it and run as the /completion
// of its completion fields; each step refuses a body its own way.
func TestInfillConvert(t *testing.T) {
	info := iface.BackendInfo{Name: "mock", NCtx: 1000, NVocab: 256, NSlots: 2}
	def := iface.SamplerParams{Temperature: 0.5, Seed: 10}
	budget := InfillBudget{NBatch: 100, NPredict: 10, NCtx: 1000}
	repo := cat([]int32{fRep}, bytesOf("myproject\n"))
	for _, c := range []struct {
		name, body string
		want       []int32 // the prompt
		n          int     // completions
		err        string  // or the refusal
		param      any
	}{
		{name: "text pieces and files", body: `{"input_prefix":"ab","input_suffix":"c","input_extra":[{"filename":"f","text":"x"},{"text":"y"}],"prompt":"p","n_predict":4}`,
			want: cat(repo, []int32{fSep}, bytesOf("f\n", "x"), []int32{fSep}, bytesOf("tmp\n", "y"), []int32{fSep}, bytesOf("filename\n"),
				[]int32{fPre}, bytesOf("ab", "p"), []int32{fSuf}, bytesOf("c"), []int32{fMid}), n: 1},
		{name: "token ids mixed in, two completions", body: `{"input_prefix":["a",7],"input_suffix":[8],"n_cmpl":2}`,
			want: cat(repo, []int32{fSep}, bytesOf("filename\n"), []int32{fPre}, bytesOf("a"), []int32{7, fSuf, 8, fMid}), n: 2},
		{name: "no prefix", body: `{"input_suffix":"b"}`, err: `"input_prefix" is required`, param: "input_prefix"},
		{name: "no suffix", body: `{"input_prefix":"a"}`, err: `"input_suffix" is required`, param: "input_suffix"},
		{name: "a prompt that is no string", body: `{"input_prefix":"a","input_suffix":"b","prompt":3}`, err: `"prompt" must be a string`, param: "prompt"},
		{name: "a file without text", body: `{"input_prefix":"a","input_suffix":"b","input_extra":[{"filename":"x"}]}`,
			err: `extra_context chunk must contain a "text" field with a string value`, param: "input_extra"},
		{name: "a prefix of another kind", body: `{"input_prefix":3,"input_suffix":"b"}`,
			err: "input_prefix must be a string or an array of strings and token ids", param: "input_prefix"},
		{name: "a token id out of range", body: `{"input_prefix":["a",-1],"input_suffix":"b"}`, err: "input_prefix[1]: -1 is not a token id", param: "input_prefix[1]"},
		{name: "the tokenizer fails", body: `{"input_prefix":"fail","input_suffix":"b"}`, err: "tokenizer failed"},
		{name: "a completion field wrong", body: `{"input_prefix":"a","input_suffix":"b","temperature":"hot","stop":5}`,
			err: "stop must be a string or an array of strings", param: "stop"},
		{name: "two passed fields wrong", body: `{"input_prefix":"a","input_suffix":"b","temperature":"hot","seed":"x"}`,
			err: "field seed: expected an integer, got a string", param: "seed"},
		{name: "a field the engine lacks", body: `{"input_prefix":"a","input_suffix":"b","mirostat":2}`,
			err: "mirostat 2 is not supported: this engine has no Mirostat sampler (send 0 or leave it out)", param: "mirostat"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var prompt []int32
			in, err := ReadInfill([]byte(c.body))
			if err == nil {
				prompt, err = in.Prompt(fakeTokens{}, testSpecial, budget)
			}
			var cs []Completion
			if err == nil {
				cs, err = in.Convert(prompt, def, -1, info)
			}
			if c.err != "" {
				var e *run.Error
				if errors.As(err, &e) {
					if e.Status != http.StatusBadRequest || e.Msg != c.err || e.Param != c.param {
						t.Fatalf("%#v, want 400 %q (param %v)", e, c.err, c.param)
					}
				} else if err == nil || err.Error() != c.err || c.param != nil {
					t.Fatalf("%v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(prompt, c.want) || len(cs) != c.n {
				t.Fatalf("prompt %v, %d completions; want %v, %d", prompt, len(cs), c.want, c.n)
			}
			for i, x := range cs {
				if x.Index != i || !reflect.DeepEqual(x.Request.Prefill.Tokens, c.want) || x.Request.Chat {
					t.Errorf("completion %d: %s", i, fmt.Sprint(x.Request.Prefill))
				}
			}
		})
	}
}
