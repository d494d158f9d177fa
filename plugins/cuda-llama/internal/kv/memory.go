package kv

import "github.com/hydra-engine/hydra-engine/iface"

// Memory is the edits the rules make to a context's memory, by sequence and
// position, as llama.cpp's llama_memory_seq_* make them.
type Memory interface {
	// SeqRm empties the sequence.
	SeqRm(seq int)
	// SeqRmFrom removes positions p0 and after; false where the memory
	// cannot be cut there (a recurrent state holds its last token), the
	// sequence then as it was.
	SeqRmFrom(seq, p0 int) bool
	// SeqRmRange removes positions [p0, p1).
	SeqRmRange(seq, p0, p1 int)
	// SeqShift adds delta to positions [p0, p1).
	SeqShift(seq, p0, p1, delta int)
	// SeqPosMin is the first position the memory holds; -1 if empty.
	SeqPosMin(seq int) int
	// CanShift reports whether positions can move (context shift, reuse).
	CanShift() bool
}

// Cuttable reports whether a sequence whose memory's first position is
// first may be cut to its first keep positions: a sliding window of window
// positions must still hold the window before keep. A recurrent state's
// first position is its last token's, so it passes only where nothing
// after keep is held, and the cut itself then refuses the rest.
func Cuttable(first, keep, window int) bool {
	return keep > 0 && first >= 0 && first <= max(0, keep-window)
}

// Cut keeps the first keep positions of sequence seq where its memory can
// be cut there and still serve the next position, as llama-server reuses a
// prompt without checkpoints; false leaves the memory as it was.
func Cut(m Memory, seq, keep, window int) bool {
	return Cuttable(m.SeqPosMin(seq), keep, window) && m.SeqRmFrom(seq, keep)
}

// Move moves a sequence's cells at positions [From, From+N) to [To, To+N).
type Move struct{ From, To, N int }

// Prefill is what a prompt keeps of its slot's sequence before checkpoints
// are weighed: the tokens it shares with the sequence from the start
// (Prefix), and with minChunk > 0 on a memory that can shift, the later
// chunks of at least minChunk tokens it repeats in order (Moves, as
// llama-server's --cache-reuse); Keep is the prompt's tokens the slot then
// holds, never its last, whose logits are the reply's.
type Prefill struct {
	Prefix, Keep int
	Moves        []Move
}

// PlanPrefill plans what prompt toks keeps of sequence old.
func PlanPrefill(m Memory, old, toks []int32, minChunk int) Prefill {
	prefix := iface.CommonPrefix(old, toks)
	p := Prefill{Prefix: prefix, Keep: prefix}
	if minChunk > 0 && m.CanShift() {
		p.Moves, p.Keep = reuse(old, toks, prefix, minChunk)
	}
	p.Keep = min(p.Keep, len(toks)-1)
	return p
}

// reuse finds, after the common prefix, the chunks of at least minChunk
// tokens of the old sequence that the prompt repeats in order: the moves
// that put them in place and the prompt tokens the slot then holds.
func reuse(old, toks []int32, prefix, minChunk int) ([]Move, int) {
	var moves []Move
	c, p := prefix, prefix // the next old and prompt positions
	for c < len(old) && p < len(toks) {
		n := iface.CommonPrefix(old[c:], toks[p:])
		if n < minChunk {
			c++
			continue
		}
		moves = append(moves, Move{From: c, To: p, N: n})
		c, p = c+n, p+n
	}
	return moves, p
}

// ApplyMoves puts a prefill's reused chunks in place and drops the rest of
// the sequence after keep. The memory's keys are re-rotated by its next
// evaluation, which rewrites the whole cache: no state transfer may be in
// flight.
func ApplyMoves(m Memory, seq int, moves []Move, keep int) {
	for _, mv := range moves {
		m.SeqRmRange(seq, mv.To, mv.From)
		m.SeqShift(seq, mv.From, mv.From+mv.N, mv.To-mv.From)
	}
	m.SeqRmFrom(seq, keep)
}

// Shift makes room in a full sequence of tokens toks as llama-server's
// context shift does: it keeps the first nKeep tokens (after BOS, where
// the sequence starts with bos), drops half of the rest and moves the
// later half down. It returns the tokens kept, and how many were kept at
// the start and dropped. As ApplyMoves, no state transfer may be in flight.
func Shift(m Memory, seq int, toks []int32, nKeep int, bos int32) (kept []int32, keep, discard int) {
	if len(toks) > 0 && toks[0] == bos {
		nKeep++
	}
	keep = min(max(nKeep, 0), len(toks)-1)
	discard = (len(toks) - keep) / 2
	m.SeqRmRange(seq, keep, keep+discard)
	m.SeqShift(seq, keep+discard, len(toks), -discard)
	kept = append(toks[:keep:keep], toks[keep+discard:]...)
	return kept, keep, discard
}
