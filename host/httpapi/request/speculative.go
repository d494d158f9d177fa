package request

import (
	"math"

	"github.com/hydra-engine/hydra-engine/iface"
)

// speculativeFields are llama-server's per-request bounds on speculative
// decoding, flat keys with a dot as it names them.
type speculativeFields struct {
	SpecNMax *int64   `json:"speculative.n_max"`
	SpecNMin *int64   `json:"speculative.n_min"`
	SpecPMin *float64 `json:"speculative.p_min"`
}

// parse checks the fields; nil when none is given, so that a backend
// without speculative decoding sees no request for it.
func (f speculativeFields) parse() (*iface.SpeculativeParams, error) {
	if f.SpecNMax == nil && f.SpecNMin == nil && f.SpecPMin == nil {
		return nil, nil
	}
	p := iface.NoSpeculativeOverride
	for name, v := range map[string]struct {
		in  *int64
		out *int
	}{"speculative.n_max": {f.SpecNMax, &p.NMax}, "speculative.n_min": {f.SpecNMin, &p.NMin}} {
		if v.in == nil {
			continue
		}
		if *v.in < 0 || *v.in > math.MaxInt16 {
			return nil, badRequest("%s must be in [0, %d], got %d", name, math.MaxInt16, *v.in)
		}
		*v.out = int(*v.in)
	}
	if v := f.SpecPMin; v != nil {
		if *v < 0 || *v > 1 || math.IsNaN(*v) {
			return nil, badRequest("speculative.p_min must be in [0, 1], got %g", *v)
		}
		p.PMin = float32(*v)
	}
	return &p, nil
}
