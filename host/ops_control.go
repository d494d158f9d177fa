package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/hydra-engine/hydra-engine/host/tracing"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// handleConfigure applies engine-wide tunables. The key is any slot id (the
// effect is engine-wide); a bad request changes nothing.
func (s *Server) handleConfigure(req *request, rp *replier) error {
	slot := engineKey(req.key)
	log := tracing.Logger(req.ctx, s.log)
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	_, info := s.Backend()
	parsed, ignored, err := parseConfigure(payload, info.SlotCtx())
	if err != nil {
		// One line, in the log as in the reply, however many keys were bad.
		msg := oneLine(err)
		log.Warn(fmt.Sprintf("CONFIGURE failed to parse config_json (slot %d): %s", slot, msg))
		return rp.fail(transport.StatusError, msg)
	}
	res := parsed.apply(s.tun, ignored)
	m := transport.NewMeta().Add("success", true)
	if res.ChunkRequested != "" {
		log.Info(fmt.Sprintf("CONFIGURE state_chunk_size requested=%s applied=%d (slot %d)", res.ChunkRequested, res.ChunkApplied, slot))
		m.Add("state_chunk_size_applied", res.ChunkApplied)
	} else {
		log.Info(fmt.Sprintf("CONFIGURE received (slot %d)", slot))
	}
	if res.Params != nil {
		m.Add("params_applied", res.Params)
	}
	if len(res.Ignored) > 0 {
		log.Info("CONFIGURE ignored unknown keys", "keys", res.Ignored)
		m.Add("ignored_keys", res.Ignored)
	}
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// DownBackend is implemented by a stand-in for a backend that is not there,
// such as pluginproc's while it relaunches a dead plugin: Down says why.
type DownBackend interface {
	Down() error
}

// handleInfo describes the engine. The key is ignored. While the backend is
// down, or does not answer within BackendAnswerTimeout, INFO answers ERROR
// with the reason and no backend details: a
// coordinator then treats the engine as unusable until a later poll, as it
// would a failed INFO, instead of routing work by stale model details.
func (s *Server) handleInfo(req *request, rp *replier) error {
	b, info := s.Backend()
	down := func(err error) error {
		return rp.replyMeta(transport.StatusError, transport.NewMeta().Add("error", err.Error()).
			Add("engine", "hydra-engine").Add("version", s.cfg.Version).Add("backend", info.Name).
			Add("backend_available", false), nil)
	}
	if d, ok := b.(DownBackend); ok {
		return down(d.Down())
	}
	now, err := s.backendInfoNow(req.ctx)
	if err != nil {
		return down(err)
	}
	mode := s.expertMode(info)
	cs := s.Combined()
	peerAddr, peerReachable := cs.peer(info)
	m := transport.NewMeta().Add("engine", "hydra-engine").Add("version", s.cfg.Version).Add("capabilities", capabilities(info, peerReachable)).
		Add("preset_aliases", []string{}).Add("solo_active", mode == "solo").Add("rpc_backend_active", cs.Lending).
		Add("mode", mode).Add("peer_addr", peerAddr).Add("peer_reachable", peerReachable).
		Add("layer_split", info.LayerSplit).Add("combined_head_attached", mode == "combined").Add("pipeline_capable", false).
		Add("split_mode", info.SplitMode).Add("quant_keys", append([]string{}, info.Quants...)).Add("active_quant", info.ActiveQuant).
		Add("backend", info.Name).Add("backend_version", info.Version).Add("n_slots", info.NSlots).
		Add("n_ctx", info.NCtx).Add("n_vocab", info.NVocab).Add("state_chunk_size", s.tun.StateChunkSize()).
		AddFields(info.Model)
	used, free := s.kvCells(info)
	m.Add("n_ctx_slot", info.SlotCtx()).Add("kv_unified", info.KVUnified).Add("kv_cells_used", used).
		Add("kv_cells_free", free).Add("sampler", s.tun.Sampler())
	addCheckpoints(m, now.Checkpoints)
	cs.add(m)
	return rp.replyMeta(transport.StatusOK, m, nil)
}

// BackendAnswerTimeout is how long INFO and /health wait for the backend to
// answer before they report it unavailable: a plugin that hangs (stopped,
// deadlocked) must not pass for a healthy one.
const BackendAnswerTimeout = 5 * time.Second

// BackendAnswers asks the backend for its info within BackendAnswerTimeout
// and says why it did not answer.
func (s *Server) BackendAnswers(ctx context.Context) error {
	_, err := s.backendInfoNow(ctx)
	return err
}

// backendInfoNow is the backend's info as it answers now, within
// BackendAnswerTimeout.
func (s *Server) backendInfoNow(ctx context.Context) (iface.BackendInfo, error) {
	b, _ := s.Backend()
	ctx, cancel := context.WithTimeout(ctx, BackendAnswerTimeout)
	defer cancel()
	info, err := b.Info(ctx)
	if err != nil {
		return iface.BackendInfo{}, fmt.Errorf("the backend is not answering: %w", err)
	}
	return info, nil
}

// addCheckpoints adds the context checkpoints' figures to INFO:
// ctx_checkpoints, a slot's most (0 where the backend takes none), the
// checkpoints held by all slots and their bytes.
func addCheckpoints(m *transport.Meta, c *iface.CheckpointStats) {
	if c == nil {
		m.Add("ctx_checkpoints", 0).Add("checkpoints_held", 0).Add("checkpoint_bytes", 0)
		return
	}
	m.Add("ctx_checkpoints", c.MaxPerSlot).Add("checkpoints_held", c.Held).Add("checkpoint_bytes", c.Bytes)
}

// kvCells is how many KV cells the slots' sequences hold and how many more
// they could: the free cells of the pool they share, or the rest of each
// slot's own share.
func (s *Server) kvCells(info iface.BackendInfo) (used, free int) {
	for _, v := range s.Slots() {
		used += v.NPast
		if info.SplitKV() {
			free += max(info.SlotCtx()-v.NPast, 0)
		}
	}
	if !info.SplitKV() {
		free = max(info.NCtx-used, 0)
	}
	return used, free
}

// handleSetExpertMode asks the backend for "solo" or "combined" (exact).
func (s *Server) handleSetExpertMode(req *request, rp *replier) error {
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	mode := string(payload)
	if mode != "solo" && mode != "combined" {
		return rp.replyMeta(transport.StatusError, transport.NewMeta().Add("success", false).
			Add("error", "expert_mode must be 'solo' or 'combined'"), nil)
	}
	b, _ := s.Backend()
	var active string
	if s.peerHead() {
		active, err = s.setPeerMode(req.ctx, mode)
	} else {
		active, err = b.SetExpertMode(req.ctx, mode)
	}
	if err != nil {
		return rp.replyMeta(statusOf(err), transport.NewMeta().Add("success", false).Add("error", err.Error()), nil)
	}
	s.tun.setExpertMode(active)
	s.refreshInfo(b)
	reply := transport.NewMeta().Add("success", true).Add("mode", active)
	if cs := s.Combined(); cs.Following {
		// The coordinator reads peer_connected false as a refusal.
		reply.Add("peer_connected", cs.Connected && active == "combined")
		if active != mode {
			reply.Add("reason", cs.Why)
		}
	}
	return rp.replyMeta(transport.StatusOK, reply, nil)
}

// capabilities are INFO's: the engine's (state_shm: STATE_EXPORT and
// STATE_IMPORT on its Unix sockets), the backend's own, and those its
// info implies (quant_swap with quantisations to swap to, combined with a
// peer, a device or an engine, that can be had), each once.
func capabilities(info iface.BackendInfo, peerReachable bool) []string {
	caps := []string{"prefill", "decode", "state_transfer", "expert_mode", "model_hash"}
	if handoffCapability != "" {
		caps = append(caps, handoffCapability)
	}
	for _, c := range append(slices.Clone(info.Capabilities), implied(info, peerReachable)...) {
		if !slices.Contains(caps, c) {
			caps = append(caps, c)
		}
	}
	return caps
}

// implied are the capabilities the backend's info shows it has.
func implied(info iface.BackendInfo, peerReachable bool) []string {
	var caps []string
	if len(info.Quants) > 0 {
		caps = append(caps, "quant_swap")
	}
	if peerReachable {
		caps = append(caps, "combined")
	}
	return caps
}

// expertMode is the mode the backend reports, else the one it last
// answered SET_EXPERT_MODE with (a backend that does not report it).
func (s *Server) expertMode(info iface.BackendInfo) string {
	if info.ExpertMode != "" {
		return info.ExpertMode
	}
	return s.tun.ExpertMode()
}

// refreshInfo re-reads the backend's info after an op that changes it (the
// model identity after a swap, the expert mode), so INFO and the identity
// in every reply tell the truth; a backend replaced meanwhile keeps its own.
func (s *Server) refreshInfo(b iface.Backend) iface.BackendInfo {
	info, err := b.Info(s.ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.log.Warn("re-reading the backend's info", "error", err)
		return s.info
	}
	if s.backend == b {
		s.info = info
	}
	return info
}

// MaxTensorPattern is the longest SWAP_QUANT tensor pattern: far more than
// any list of tensor names needs, short enough that the pattern's
// compilation and a log line stay small.
const MaxTensorPattern = 4096

// parseSwapQuant splits a SWAP_QUANT payload: u16 quant_key_len, quant_key,
// tensor_pattern (the rest, at most MaxTensorPattern bytes).
func parseSwapQuant(p []byte) (key, pattern string, err error) {
	if len(p) < 2 {
		return "", "", fmt.Errorf("SWAP_QUANT payload of %d bytes is shorter than its 2-byte header", len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > len(p)-2 {
		return "", "", fmt.Errorf("SWAP_QUANT quant_key_len %d exceeds the %d bytes that follow", n, len(p)-2)
	}
	if m := len(p) - 2 - n; m > MaxTensorPattern {
		return "", "", fmt.Errorf("SWAP_QUANT tensor_pattern of %d bytes is longer than %d", m, MaxTensorPattern)
	}
	return string(p[2 : 2+n]), string(p[2+n:]), nil
}

// abbreviate is s for a log line: at most 128 bytes of it, and its length
// when cut.
func abbreviate(s string) string {
	const max = 128
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// swapDrainWait is how long SWAP_QUANT waits for the work in progress on
// every slot to end (the C++ engine's SWAP_QUANT timeout).
const swapDrainWait = 30 * time.Second

// handleSwapQuant forwards to the backend (a backend without quantisations
// answers NOT_IMPLEMENTED) once it holds every slot, after the work on them
// ended (HTTP completions that arrive meanwhile wait in their queue), and
// replies with what it did, the reference's keys first, then the request
// and the model identity as it now is.
func (s *Server) handleSwapQuant(req *request, rp *replier) error {
	payload, ok, err := s.readPayload(req, rp)
	if !ok {
		return err
	}
	key, pattern, err := parseSwapQuant(payload)
	if err != nil {
		return rp.replyMeta(transport.StatusError, transport.NewMeta().Add("success", false).Add("error", err.Error()), nil)
	}
	b, info := s.Backend()
	if len(info.Quants) > 0 { // a backend without quantisations answers NOT_IMPLEMENTED at once
		ctx, cancel := context.WithTimeout(req.ctx, swapDrainWait)
		release, err := s.slots.holdAll(ctx)
		cancel()
		if err != nil {
			return rp.replyMeta(statusOf(err), transport.NewMeta().Add("success", false).Add("error", err.Error()), nil)
		}
		defer release()
	}
	res, err := b.SwapQuant(req.ctx, key, pattern)
	log := tracing.Logger(req.ctx, s.log)
	if err != nil {
		log.Info("SWAP_QUANT refused", "quant_key", abbreviate(key), "tensor_pattern", abbreviate(pattern), "error", err)
		return rp.replyMeta(statusOf(err), transport.NewMeta().Add("success", false).Add("error", err.Error()), nil)
	}
	info = s.refreshInfo(b)
	s.nudgeLender()
	ms := float64(res.Duration.Microseconds()) / 1000
	log.Info("SWAP_QUANT", "quant_key", abbreviate(key), "tensor_pattern", abbreviate(pattern), "swapped", res.Swapped, "bytes", res.Bytes,
		"swap_ms", ms, "active_quant", info.ActiveQuant, "model_hash", info.Model.Hash)
	return rp.replyMeta(transport.StatusOK, transport.NewMeta().Add("success", true).Add("swapped", res.Swapped).
		Add("bytes", res.Bytes).Add("swap_ms", ms).Add("kv_preserved", res.KVPreserved).Add("quant_key", key).
		Add("tensor_pattern", pattern).Add("active_quant", info.ActiveQuant).AddFields(info.Model), nil)
}
