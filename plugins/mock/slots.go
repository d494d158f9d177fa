package mock

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Stop reasons of Decode.
const (
	StopEOS          = "eos"
	StopLength       = "length"
	StopNTokensLimit = "n_tokens_limit"
)

// slot is one sequence. mu guards the fields and is held only briefly, so
// Slot (STATE_META) answers while a long operation runs; busy marks that
// operation, turning a second concurrent one on the slot into ErrBusy instead
// of a silent interleaving should a caller break the one-op-per-slot rule.
type slot struct {
	mu   sync.Mutex
	busy bool
	// tokens is the sequence. Elements below len(tokens) are never written
	// again (appends go past them, resets install a new slice), so a snapshot
	// can share the backing array without copying.
	tokens []int32
	hash   uint64 // running hash of tokens
	claim  int    // cells an operation in progress will fill (kvUnified)
}

func (s *slot) acquire(i int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy {
		return fmt.Errorf("%w: slot %d", iface.ErrBusy, i)
	}
	s.busy = true
	return nil
}

func (s *slot) release() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

// snapshot returns the sequence (capped, so appends to it cannot clobber the
// slot's array) and its hash.
func (s *slot) snapshot() ([]int32, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[:len(s.tokens):len(s.tokens)], s.hash
}

// set installs a sequence the slot owns from now on.
func (s *slot) set(tokens []int32, hash uint64) {
	s.mu.Lock()
	s.tokens, s.hash = tokens, hash
	s.mu.Unlock()
}

func (s *slot) clear() { s.set(nil, hashSeed) }

func (s *slot) push(tok int32, hash uint64) {
	s.mu.Lock()
	s.tokens, s.hash = append(s.tokens, tok), hash
	s.mu.Unlock()
}

// claimCells makes slot i's claim n cells, failing with iface.ErrNoRoom when
// the other slots' sequences and claims leave fewer in the shared pool;
// without a shared pool only n_ctx bounds a slot (promptTokens checks it).
func (e *engine) claimCells(i, n int) error {
	if !e.kvUnified {
		return nil
	}
	e.cells.Lock()
	defer e.cells.Unlock()
	if used := e.cellsUsedLocked(i); used+n > e.nCtx {
		return fmt.Errorf("%w: needs %d KV cells, %d free (shared by all slots, n_ctx %d): clear a slot first",
			iface.ErrNoRoom, n, e.nCtx-used, e.nCtx)
	}
	s := e.slots[i]
	s.mu.Lock()
	s.claim = n
	s.mu.Unlock()
	return nil
}

// unclaim drops slot i's claim.
func (e *engine) unclaim(i int) {
	e.cells.Lock()
	defer e.cells.Unlock()
	s := e.slots[i]
	s.mu.Lock()
	s.claim = 0
	s.mu.Unlock()
}

// cellsUsedLocked is how many cells the slots other than i hold or claim;
// e.cells is held.
func (e *engine) cellsUsedLocked(i int) int {
	used := 0
	for k, s := range e.slots {
		if k == i {
			continue
		}
		s.mu.Lock()
		used += len(s.tokens) + s.claim
		s.mu.Unlock()
	}
	return used
}

// pushToken appends tok to slot i's sequence of have tokens, unless the
// shared pool is full (false); the check and the append are one step, so
// slots decoding at once never take more than the pool.
func (e *engine) pushToken(i, have int, tok int32, hash uint64) bool {
	if e.kvUnified {
		e.cells.Lock()
		defer e.cells.Unlock()
		if e.cellsUsedLocked(i)+have >= e.nCtx {
			return false
		}
	}
	e.slots[i].push(tok, hash)
	return true
}

func (e *engine) slotInfo(i int, tokens []int32) iface.SlotInfo {
	return iface.SlotInfo{
		Slot:      i,
		NPast:     len(tokens),
		Tokens:    slices.Clone(tokens),
		StateSize: StateSize(e.kvBytes, len(tokens)),
	}
}

// Slot reports a slot's sequence; it does not wait for a running operation.
func (b *Backend) Slot(ctx context.Context, i int) (iface.SlotInfo, error) {
	e, s, err := b.slot(i)
	if err != nil {
		return iface.SlotInfo{}, err
	}
	toks, _ := s.snapshot()
	return e.slotInfo(i, toks), nil
}

// ClearSlot empties a slot.
func (b *Backend) ClearSlot(ctx context.Context, i int) error {
	_, s, err := b.slot(i)
	if err != nil {
		return err
	}
	if err := s.acquire(i); err != nil {
		return err
	}
	defer s.release()
	s.clear()
	return nil
}

// Prefill replaces the slot's sequence with the prompt. The slot is emptied
// first, so an interrupted prefill leaves it empty, not holding the old one.
func (b *Backend) Prefill(ctx context.Context, req iface.PrefillRequest) (iface.PrefillResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	prompt, err := promptTokens(req, e.nCtx)
	if err != nil {
		return iface.PrefillResult{}, err
	}
	if err := s.acquire(req.Slot); err != nil {
		return iface.PrefillResult{}, err
	}
	defer s.release()
	b.fromCache(ctx, e, req.Slot, s, prompt, req)
	old, _ := s.snapshot()
	reused := min(iface.CommonPrefix(old, prompt), len(prompt)-1) // the last token is always evaluated: its logits are the reply's
	s.clear()
	if err := e.claimCells(req.Slot, len(prompt)); err != nil {
		return iface.PrefillResult{}, err
	}
	defer e.unclaim(req.Slot)
	if err := sleep(ctx, e.opDelay); err != nil {
		return iface.PrefillResult{}, err
	}
	toks := slices.Clone(prompt) // req.Tokens stays the caller's
	h := seqHash(toks)
	s.set(toks, h)

	fallback := req.Model != "" && req.Model != e.info.Model.Alias
	if fallback {
		b.log.Warn("requested model is not resident, staying on the resident one",
			"requested", req.Model, "resident", e.info.Model.Alias, "slot", req.Slot)
	}
	return iface.PrefillResult{
		Slot:          e.slotInfo(req.Slot, toks),
		Logits:        logits(h),
		ModelFallback: fallback,
		Reused:        reused,
	}, nil
}

// Tokenize returns the tokens Prefill would evaluate for req.
func (b *Backend) Tokenize(ctx context.Context, req iface.PrefillRequest) (iface.Prompt, error) {
	e, err := b.engine()
	if err != nil {
		return iface.Prompt{}, err
	}
	if req.Tokenize != nil {
		return tokenizeText(req)
	}
	toks, err := promptTokens(req, e.nCtx)
	return iface.Prompt{Tokens: slices.Clone(toks)}, err
}

// Decode continues the slot's sequence, after prefilling req.Prompt when it
// is set. Generated tokens join the sequence as they are produced, so an
// interrupted decode keeps what it emitted.
func (b *Backend) Decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	// The mock's tokens are no language: it cannot constrain or parse them.
	if req.Speculative != nil {
		return iface.DecodeResult{}, fmt.Errorf("%w: the mock backend has no speculative decoding (speculative.n_max, n_min, p_min)", iface.ErrNotImplemented)
	}
	if req.Output != nil {
		return iface.DecodeResult{}, fmt.Errorf("%w: the mock backend constrains and parses no reply (tool calls, response_format, json_schema, grammar, stop strings of a parsed chat, a reasoning budget)", iface.ErrNotImplemented)
	}
	if req.Prompt == nil || req.NPredict < 0 {
		return b.decode(ctx, req, emit)
	}
	start := time.Now()
	p := *req.Prompt
	p.Slot = req.Slot
	pres, err := b.Prefill(ctx, p)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	pr := pres.PromptResult(time.Since(start))
	res, err := b.decode(ctx, req, emit)
	res.Prompt = pr
	return res, err
}

func (b *Backend) decode(ctx context.Context, req iface.DecodeRequest, emit func(iface.Token) error) (iface.DecodeResult, error) {
	e, s, err := b.slot(req.Slot)
	if err != nil {
		return iface.DecodeResult{}, err
	}
	if req.NPredict < 0 {
		return iface.DecodeResult{}, fmt.Errorf("%w: n_predict %d is negative", iface.ErrBadRequest, req.NPredict)
	}
	if err := s.acquire(req.Slot); err != nil {
		return iface.DecodeResult{}, err
	}
	defer s.release()
	toks, h := s.snapshot()
	if len(toks) == 0 {
		return iface.DecodeResult{}, fmt.Errorf("%w: slot is empty (slot %d)", iface.ErrBadRequest, req.Slot)
	}
	res := iface.DecodeResult{NPast: len(toks)}
	for {
		switch {
		case res.TokensGenerated >= req.NPredict:
			res.StopReason = StopLength
			return res, nil
		case res.NPast >= e.nCtx:
			res.StopReason = StopNTokensLimit
			return res, nil
		}
		if err := sleep(ctx, e.opDelay); err != nil {
			return res, err
		}
		tok, rank := sample(h, req.Sampler)
		if tok == EOS {
			res.StopReason = StopEOS
			return res, nil
		}
		t := iface.Token{ID: tok, Text: piece(tok)}
		if req.Logprobs {
			t.Logprob = logprob(h, rank)
		}
		if req.NProbs > 0 {
			t.Top = alternatives(h, req.NProbs)
		}
		h = step(h, tok)
		if !e.pushToken(req.Slot, res.NPast, tok, h) {
			res.StopReason = StopNTokensLimit
			return res, nil
		}
		res.TokensGenerated++
		res.NPast++
		if emit != nil {
			if err := emit(t); err != nil {
				return res, err
			}
		}
	}
}

// SlotCheckpoint: the mock's fake memory can be cut anywhere, so its slots
// hold no context checkpoints.
func (b *Backend) SlotCheckpoint(ctx context.Context, i int) (*iface.Checkpoint, error) {
	_, _, err := b.slot(i)
	return nil, err
}

// PutCheckpoint declines a carried checkpoint, saying why: the mock's
// memory can be cut anywhere, so it needs none.
func (b *Backend) PutCheckpoint(ctx context.Context, i int, c iface.Checkpoint) (bool, string, error) {
	if _, _, err := b.slot(i); err != nil {
		return false, "", err
	}
	return false, "the mock's memory can be cut anywhere: it keeps no checkpoints", nil
}
