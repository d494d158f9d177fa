package iface

import backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"

func speculativeToPB(p *SpeculativeParams) *backendv1.SpeculativeParams {
	if p == nil {
		return nil
	}
	return &backendv1.SpeculativeParams{NMax: int32(p.NMax), NMin: int32(p.NMin), PMin: p.PMin}
}

func speculativeFromPB(p *backendv1.SpeculativeParams) *SpeculativeParams {
	if p == nil {
		return nil
	}
	return &SpeculativeParams{NMax: int(p.GetNMax()), NMin: int(p.GetNMin()), PMin: p.GetPMin()}
}
