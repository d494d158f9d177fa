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
	payload, err := req.readPayload()
	if err != nil {
		return errFatal{err}
	}
	parsed, ignored, err := parseConfigure(payload)
	if err != nil {
		s.log.Warn(fmt.Sprintf("CONFIGURE failed to parse config_json (slot %d): %v", slot, err))
		return rp.fail(transport.StatusError, err.Error())
	}
	res := parsed.apply(s.tun, ignored)
	m := newMeta().add("success", true)
	if res.ChunkRequested != "" {
		s.log.Info(fmt.Sprintf("CONFIGURE state_chunk_size requested=%s applied=%d (slot %d)", res.ChunkRequested, res.ChunkApplied, slot))
		m.add("state_chunk_size_applied", res.ChunkApplied)
	} else {
		s.log.Info(fmt.Sprintf("CONFIGURE received (slot %d)", slot))
	}
	if res.Params != nil {
		m.add("params_applied", res.Params)
	}
	if len(res.Ignored) > 0 {
		s.log.Info("CONFIGURE ignored unknown keys", "keys", res.Ignored)
		m.add("ignored_keys", res.Ignored)
	}
	return rp.reply(transport.StatusOK, m.bytes(), nil)
}

// handleInfo describes the engine. The key is ignored.
func (s *Server) handleInfo(req *request, rp *replier) error {
	_, info := s.Backend()
	caps := []string{"prefill", "decode", "state_transfer", "expert_mode", "model_hash"}
	caps = append(caps, info.Capabilities...)
	mode := s.tun.ExpertMode()
	m := newMeta().add("engine", "hydra-engine").add("version", s.cfg.Version).add("capabilities", caps).
		add("preset_aliases", []string{}).add("solo_active", mode == "solo").add("rpc_backend_active", false).
		add("mode", mode).add("peer_addr", "").add("peer_reachable", false).add("layer_split", "").
		add("combined_head_attached", false).add("pipeline_capable", false).
		add("backend", info.Name).add("backend_version", info.Version).add("n_slots", info.NSlots).
		add("n_ctx", info.NCtx).add("n_vocab", info.NVocab).add("state_chunk_size", s.tun.StateChunkSize()).
		identity(info.Model)
	return rp.reply(transport.StatusOK, m.bytes(), nil)
}

// handleSetExpertMode asks the backend for "solo" or "combined" (exact).
func (s *Server) handleSetExpertMode(req *request, rp *replier) error {
	payload, err := req.readPayload()
	if err != nil {
		return errFatal{err}
	}
	mode := string(payload)
	if mode != "solo" && mode != "combined" {
		return rp.reply(transport.StatusError, newMeta().add("success", false).
			add("error", "expert_mode must be 'solo' or 'combined'").bytes(), nil)
	}
	b, _ := s.Backend()
	active, err := b.SetExpertMode(s.ctx, mode)
	if err != nil {
		return rp.reply(statusOf(err), newMeta().add("success", false).add("error", err.Error()).bytes(), nil)
	}
	s.tun.setExpertMode(active)
	return rp.reply(transport.StatusOK, newMeta().add("success", true).add("mode", active).bytes(), nil)
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
	payload, err := req.readPayload()
	if err != nil {
		return errFatal{err}
	}
	key, pattern, err := parseSwapQuant(payload)
	if err != nil {
		return rp.reply(transport.StatusError, newMeta().add("success", false).add("error", err.Error()).bytes(), nil)
	}
	b, _ := s.Backend()
	if err := b.SwapQuant(s.ctx, key, pattern); err != nil {
		return rp.reply(statusOf(err), newMeta().add("success", false).add("error", err.Error()).bytes(), nil)
	}
	return rp.reply(transport.StatusOK, newMeta().add("success", true).add("quant_key", key).
		add("tensor_pattern", pattern).bytes(), nil)
}
