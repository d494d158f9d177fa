package llamaopt

import (
	"fmt"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Options of SWAP_QUANT: the quantisations of the loaded model it swaps to.
const (
	// OptQuantPrefix starts the key quant.KEY=PATH: PATH is the loaded model
	// in another quantisation (a GGUF of the same architecture, weight names
	// and shapes), which SWAP_QUANT names KEY.
	OptQuantPrefix = "quant."
	// QuantBase is the key of the loaded model itself, reserved.
	QuantBase = "base"
)

// QuantOptions are the parsed quant.KEY options; the zero value swaps to
// nothing.
type QuantOptions struct {
	Quants map[string]string // key → path
}

// swapPrefixOptions are the options of this file whose keys start with a prefix, in the table.
var swapPrefixOptions = []option{
	{key: OptQuantPrefix, def: "none", doc: "quant.KEY=PATH: the loaded model in another quantisation, which SWAP_QUANT names KEY",
		parse: parseQuant},
}

// parseQuant reads quant.KEY=PATH. A key is any text without blanks or "+"
// (INFO joins the active keys with it), "base" excepted; whether PATH is a
// model of the same weights is for Load to say.
func parseQuant(o *Options, key, v string) error {
	k := strings.TrimPrefix(key, OptQuantPrefix)
	switch {
	case k == "":
		return fmt.Errorf("%w: option %s: the key after %q must not be empty (quant.KEY=PATH)", iface.ErrBadRequest, key, OptQuantPrefix)
	case strings.EqualFold(k, QuantBase):
		return fmt.Errorf("%w: option %s: %q names the loaded model itself and cannot be configured", iface.ErrBadRequest, key, QuantBase)
	case strings.ContainsAny(k, "+ \t\r\n"):
		return fmt.Errorf("%w: option %s: a quantisation key holds no blanks and no '+'", iface.ErrBadRequest, key)
	case v == "":
		return fmt.Errorf("%w: option %s: needs the path of a GGUF file", iface.ErrBadRequest, key)
	}
	if o.Quants == nil {
		o.Quants = map[string]string{}
	}
	o.Quants[k] = v
	return nil
}
