package llamaopt

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// quant.KEY options: one per key, whatever the key's text; "base", blanks,
// "+" and empty values are refused.
func TestQuantOptions(t *testing.T) {
	o, err := Parse(map[string]string{"quant.q8_0": "/m/q8.gguf", "quant.Q6_K/experts": " /m/q6.gguf ", "n_ctx": "512"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"q8_0": "/m/q8.gguf", "Q6_K/experts": "/m/q6.gguf"}; !maps.Equal(o.Quants, want) {
		t.Fatalf("quants %v, want %v", o.Quants, want)
	}
	if o, _ := Parse(nil); o.Quants != nil {
		t.Fatalf("no quant options: %v", o.Quants)
	}
	for key, want := range map[string]string{
		"quant.":      "must not be empty",
		"quant.base":  `"base" names the loaded model`,
		"quant.BASE":  `"base" names the loaded model`,
		"quant.a+b":   "no '+'",
		"quant.a b":   "no blanks",
		"quant.empty": "needs the path",
		"quantq8":     "unknown option",
	} {
		v := "/m/x.gguf"
		if key == "quant.empty" {
			v = " "
		}
		_, err := Parse(map[string]string{key: v})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", key, err, want)
		}
	}
}
