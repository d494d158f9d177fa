package host

import (
	"encoding/binary"
	"fmt"

	"github.com/hydra-engine/hydra-engine/transport"
)

// handleConfigure applies engine-wide tunables. The key is any slot id (the
// effect is engine-wide); a bad request changes nothing.
func (s *Server) handleConfigure(req *request, rp *replier) error {
	slot := engineKey(req.key)
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	parsed, ignored, err := parseConfigure(payload)
	if err != nil {
		// One line, in the log as in the reply, however many keys were bad.
		msg := oneLine(err)
		s.log.Warn(fmt.Sprintf("CONFIGURE failed to parse config_json (slot %d): %s", slot, msg))
		return rp.fail(transport.StatusError, msg)
	}
	res := parsed.apply(s.tun, ignored)
	m := transport.NewMeta().Add("success", true)
	if res.ChunkRequested != "" {
		s.log.Info(fmt.Sprintf("CONFIGURE state_chunk_size requested=%s applied=%d (slot %d)", res.ChunkRequested, res.ChunkApplied, slot))
		m.Add("state_chunk_size_applied", res.ChunkApplied)
	} else {
		s.log.Info(fmt.Sprintf("CONFIGURE received (slot %d)", slot))
	}
	if res.Params != nil {
		m.Add("params_applied", res.Params)
	}
	if len(res.Ignored) > 0 {
		s.log.Info("CONFIGURE ignored unknown keys", "keys", res.Ignored)
		m.Add("ignored_keys", res.Ignored)
	}
	return rp.reply(transport.StatusOK, m.Bytes(), nil)
}

// DownBackend is implemented by a stand-in for a backend that is not there,
// such as pluginproc's while it relaunches a dead plugin: Down says why.
type DownBackend interface {
	Down() error
}

// handleInfo describes the engine. The key is ignored. While the backend is
// down INFO answers ERROR with the reason and no backend details: a
// coordinator then treats the engine as unusable until a later poll, as it
// would a failed INFO, instead of routing work by stale model details.
func (s *Server) handleInfo(req *request, rp *replier) error {
	b, info := s.Backend()
	if d, ok := b.(DownBackend); ok {
		return rp.reply(transport.StatusError, transport.NewMeta().Add("error", d.Down().Error()).
			Add("engine", "hydra-engine").Add("version", s.cfg.Version).Add("backend", info.Name).
			Add("backend_available", false).Bytes(), nil)
	}
	caps := []string{"prefill", "decode", "state_transfer", "expert_mode", "model_hash"}
	caps = append(caps, info.Capabilities...)
	mode := s.tun.ExpertMode()
	m := transport.NewMeta().Add("engine", "hydra-engine").Add("version", s.cfg.Version).Add("capabilities", caps).
		Add("preset_aliases", []string{}).Add("solo_active", mode == "solo").Add("rpc_backend_active", false).
		Add("mode", mode).Add("peer_addr", "").Add("peer_reachable", false).Add("layer_split", "").
		Add("combined_head_attached", false).Add("pipeline_capable", false).
		Add("backend", info.Name).Add("backend_version", info.Version).Add("n_slots", info.NSlots).
		Add("n_ctx", info.NCtx).Add("n_vocab", info.NVocab).Add("state_chunk_size", s.tun.StateChunkSize()).
		AddFields(info.Model)
	return rp.reply(transport.StatusOK, m.Bytes(), nil)
}

// handleSetExpertMode asks the backend for "solo" or "combined" (exact).
func (s *Server) handleSetExpertMode(req *request, rp *replier) error {
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	mode := string(payload)
	if mode != "solo" && mode != "combined" {
		return rp.reply(transport.StatusError, transport.NewMeta().Add("success", false).
			Add("error", "expert_mode must be 'solo' or 'combined'").Bytes(), nil)
	}
	b, _ := s.Backend()
	active, err := b.SetExpertMode(s.ctx, mode)
	if err != nil {
		return rp.reply(statusOf(err), transport.NewMeta().Add("success", false).Add("error", err.Error()).Bytes(), nil)
	}
	s.tun.setExpertMode(active)
	return rp.reply(transport.StatusOK, transport.NewMeta().Add("success", true).Add("mode", active).Bytes(), nil)
}

// parseSwapQuant splits a SWAP_QUANT payload: u16 quant_key_len, quant_key,
// tensor_pattern (the rest).
func parseSwapQuant(p []byte) (key, pattern string, err error) {
	if len(p) < 2 {
		return "", "", fmt.Errorf("SWAP_QUANT payload of %d bytes is shorter than its 2-byte header", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > len(p)-2 {
		return "", "", fmt.Errorf("SWAP_QUANT quant_key_len %d exceeds the %d bytes that follow", n, len(p)-2)
	}
	return string(p[2 : 2+n]), string(p[2+n:]), nil
}

// handleSwapQuant forwards to the backend; most answer NOT_IMPLEMENTED.
func (s *Server) handleSwapQuant(req *request, rp *replier) error {
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	key, pattern, err := parseSwapQuant(payload)
	if err != nil {
		return rp.reply(transport.StatusError, transport.NewMeta().Add("success", false).Add("error", err.Error()).Bytes(), nil)
	}
	b, _ := s.Backend()
	if err := b.SwapQuant(s.ctx, key, pattern); err != nil {
		return rp.reply(statusOf(err), transport.NewMeta().Add("success", false).Add("error", err.Error()).Bytes(), nil)
	}
	return rp.reply(transport.StatusOK, transport.NewMeta().Add("success", true).Add("quant_key", key).
		Add("tensor_pattern", pattern).Bytes(), nil)
}
