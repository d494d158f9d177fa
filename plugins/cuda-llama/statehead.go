package cudallama

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/hydra-engine/hydra-engine/iface"
)

// A llama.cpp per-sequence state is its memory's parts one after another
// (llama_memory_i::state_write): a plain cache's one KV part; a
// sliding-window model's base and window KV parts; a hybrid model's KV part
// and recurrent part; a recurrent model's recurrent part. Little-endian:
//
//	KV part:
//	u32 n_stream                       1 with kv_unified
//	per stream: u32 cell_count         0: nothing else for this stream
//	  cell_count × {i32 pos, u32 n_seq_id = 1, [cell ext on M-RoPE models], i32 seq_id}
//	  u32 v_trans, u32 n_layer
//	  per layer: i32 k_type, u64 k_row_bytes, cell_count K rows
//	  !v_trans, per layer: i32 v_type, u64 v_row_bytes, cell_count V rows
//	  v_trans,  per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa, then per
//	            embedding row the cells' elements
//	recurrent part:
//	u32 cell_count                     1 for a sequence (its state after its last token)
//	  cell_count × {i32 pos, u32 n_seq_id = 0}
//	  u32 s_trans, u32 n_layer, per recurrent layer R rows (i32 type, u64 row bytes, rows), then S rows
//
// So a part's size is affine in its cells: statePart. A sliding window's
// part holds only the window's cells; a recurrent part's one cell is the
// whole sequence, whatever its length.
//
// llama.cpp checks the layer count, types and row sizes on restore, but
// trusts the cell counts and positions: a count of 2^32−1 makes it reserve a
// batch that large, and odd positions corrupt the sequence. readStateHead
// checks the first part's head, against the blob's tokens, before llama.cpp
// sees a byte; the restore's reader checks every part's (stateLayout.rules,
// shim.cpp's state_guard) as llama.cpp reads it.
const (
	cellMetaSize = 12 // a KV cell's metadata without the M-RoPE extension
	emptyState   = 8  // a plain cache's empty sequence: n_stream, cell_count = 0
)

// partKind is what a part of the state is: statemem.h's HYDRA_PART_*.
type partKind int

const (
	partKV partKind = iota
	partRecurrent
)

// statePart is one part of the state, measured at load.
type statePart struct {
	Kind partKind
	// Base and PerCell: the part holds Base + cells×PerCell bytes (cells > 0);
	// a recurrent part's one cell is Base, PerCell is 0.
	Base, PerCell int64
	Empty         int64 // its bytes for an empty sequence: its counts (and a recurrent part's row headers)
	CellMeta      int64 // one cell's metadata bytes
	Capacity      int   // the cells its cache has
	SWA           bool  // a sliding window: it keeps only the window's cells
	// Fields is the fields among its rows as this model writes them (a layer
	// count, the V layout, each layer's type and row size: the same for any
	// cells), which a restore's must equal; nil where not measured.
	Fields []byte
}

// cells is the cells the part holds for a sequence of n tokens, as a range:
// a sliding window holds at least the last token and at most its capacity.
func (p statePart) cells(n int) (lo, hi int) {
	switch {
	case n == 0:
		return 0, 0
	case p.Kind == partRecurrent:
		return 1, 1
	case p.SWA:
		return 1, min(n, p.Capacity)
	}
	return n, n
}

func (p statePart) size(cells int) int64 {
	if cells == 0 {
		return p.Empty
	}
	return p.Base + int64(cells)*p.PerCell
}

// stateLayout is the state's parts, and MaxRow, the largest block llama.cpp
// reads in one piece per cell (a layer's K or V row, a transposed V's
// element, a recurrent row), which sizes the restore ring. It is measured at
// load (engine.measureLayout).
type stateLayout struct {
	Parts  []statePart
	MaxRow int64
	Memory string // llama.cpp's memory module: kv, iswa, hybrid, hybrid_iswa, recurrent
}

// plainLayout is a plain cache's layout (tests).
func plainLayout(base, perCell, maxRow int64) stateLayout {
	return stateLayout{Parts: []statePart{{Kind: partKV, Base: base, PerCell: perCell, Empty: emptyState, CellMeta: cellMetaSize, Capacity: 1 << 30}},
		MaxRow: maxRow, Memory: "kv"}
}

// sizes is the range of the state's bytes for a sequence of n tokens (one
// value unless a sliding window's cells vary).
func (l stateLayout) sizes(n int) (lo, hi int64) {
	for _, p := range l.Parts {
		a, b := p.cells(n)
		lo, hi = lo+p.size(a), hi+p.size(b)
	}
	return lo, hi
}

// size is the state's bytes for a sequence of n tokens, the most where a
// sliding window's cells vary.
func (l stateLayout) size(n int) int64 {
	_, hi := l.sizes(n)
	return hi
}

// lockFrom is the offset, in the state of a sequence of n tokens that is
// size bytes, from which a restore holds the context lock while it waits
// for bytes: its first recurrent part's. llama.cpp moves an idle
// sequence's recurrent cell when other sequences decode, so none may decode
// between the part's cell being taken and its bytes written. size where no
// part is recurrent; 0 (the whole restore under the lock) where a part
// after the first recurrent one varies in size.
func (l stateLayout) lockFrom(size int64, n int) int64 {
	first := slices.IndexFunc(l.Parts, func(p statePart) bool { return p.Kind == partRecurrent })
	if first < 0 {
		return size
	}
	var tail int64
	for _, p := range l.Parts[first:] {
		lo, hi := p.cells(n)
		if lo != hi {
			return 0
		}
		tail += p.size(lo)
	}
	return max(size-tail, 0)
}

// perToken is the bytes a further token adds to the state of a long
// sequence (the parts that keep every cell).
func (l stateLayout) perToken() int64 {
	var n int64
	for _, p := range l.Parts {
		if !p.SWA {
			n += p.PerCell
		}
	}
	return n
}

// window reports whether the state has a sliding window's part: a cache
// that keeps only the window's cells.
func (l stateLayout) window() bool {
	for _, p := range l.Parts {
		if p.SWA {
			return true
		}
	}
	return false
}

// recurrent reports whether the state has a recurrent part: its last token
// cannot be evaluated again from the state (the recurrent state already
// holds it), so such states carry their logits.
func (l stateLayout) recurrent() bool {
	for _, p := range l.Parts {
		if p.Kind == partRecurrent {
			return true
		}
	}
	return false
}

// layoutModel is what a state's layout names of the model and cache beyond
// its parts: a restore needs the same architecture and dimensions, K/V
// types and V layout, whatever the weights' quantisation.
type layoutModel struct {
	Arch         string
	Layers, Embd int
	TypeK, TypeV string
	VTrans       bool // V stored transposed (flash attention off)
	Vocab        int
}

// describe is the layout as the engine's BackendInfo.StateLayout names it:
// a flat JSON object, so that a restore from another layout is refused
// naming each key that differs. Sizes that depend on n_ctx or the slot
// count (a cache's cells) are not in it: a state moves between engines of
// any.
func (l stateLayout) describe(m layoutModel) string {
	kinds := make([]string, len(l.Parts))
	d := map[string]any{"arch": m.Arch, "memory": l.Memory, "n_layer": m.Layers, "n_embd": m.Embd,
		"cache_type_k": m.TypeK, "cache_type_v": m.TypeV, "v_trans": m.VTrans}
	for i, p := range l.Parts {
		switch {
		case p.Kind == partRecurrent:
			kinds[i] = "recurrent"
			d["recurrent_bytes"] = p.Base
			d["state_logits"] = m.Vocab
		case p.SWA:
			kinds[i] = "kv_window"
			d["window_bytes_per_token"] = p.PerCell
		default:
			kinds[i] = "kv"
			d["kv_bytes_per_token"] = p.PerCell
			d["kv_cell_meta"] = p.CellMeta
		}
	}
	d["parts"] = strings.Join(kinds, "+")
	b, _ := json.Marshal(d) // plain values: cannot fail
	return string(b)
}

// vTransOf reads whether the first KV part of a one-token state stores V
// transposed (its v_trans field, after the cell).
func vTransOf(l stateLayout, oneToken []byte) (bool, error) {
	if l.Parts[0].Kind != partKV {
		return false, nil
	}
	at := 8 + l.Parts[0].CellMeta
	if int64(len(oneToken)) < at+4 || binary.LittleEndian.Uint32(oneToken[4:]) != 1 {
		return false, fmt.Errorf("a one-token state of %d bytes is not one cell", len(oneToken))
	}
	switch v := binary.LittleEndian.Uint32(oneToken[at:]); v {
	case 0, 1:
		return v == 1, nil
	default:
		return false, fmt.Errorf("a one-token state's v_trans is %d", v)
	}
}

// partRule is statemem.h's hydra_part_rule in Go: what a restore's part may
// hold for a sequence of a given length.
type partRule struct {
	Kind                 partKind
	CellMeta             int64
	Base, PerCell, Empty int64
	MinCells, MaxCells   int
	Fields               []byte
}

// rules is what each part of a restore of n tokens may hold.
func (l stateLayout) rules(n int) []partRule {
	out := make([]partRule, len(l.Parts))
	for i, p := range l.Parts {
		lo, hi := p.cells(n)
		out[i] = partRule{Kind: p.Kind, CellMeta: p.CellMeta, Base: p.Base, PerCell: p.PerCell, Empty: p.Empty, MinCells: lo, MaxCells: hi,
			Fields: p.Fields}
	}
	return out
}

// measuredPart is one part of a sequence's state as it is now (statemem.h).
type measuredPart struct {
	kind     partKind
	cellMeta int64
	capacity int
	swa      bool
	bytes    int64
	maxRow   int64
	fields   []byte // the fields among its rows (nil with no cells)
}

// measureParts turns the parts of a state measured empty, with one cell
// and with two (the scratch sequence at load) into the layout; it refuses
// what a part of its kind cannot be.
func measureParts(memory string, empty, one, two []measuredPart) (stateLayout, error) {
	l := stateLayout{Memory: memory}
	if len(one) == 0 || len(empty) != len(one) || len(two) != len(one) {
		return l, fmt.Errorf("a state of %d, %d and %d parts for 0, 1 and 2 cells", len(empty), len(one), len(two))
	}
	for i, p := range one {
		sp := statePart{Kind: p.kind, CellMeta: p.cellMeta, Capacity: p.capacity, SWA: p.swa, Empty: empty[i].bytes, Fields: p.fields}
		if !bytes.Equal(p.fields, two[i].fields) {
			return l, fmt.Errorf("part %d: the fields among its rows differ between 1 and 2 cells (%x, %x)", i, p.fields, two[i].fields)
		}
		if p.kind == partKV && sp.Empty != emptyState || sp.Empty < 4 {
			return l, fmt.Errorf("part %d of an empty sequence's state is %d bytes", i, sp.Empty)
		}
		switch p.kind {
		case partKV:
			sp.PerCell = two[i].bytes - p.bytes
			sp.Base = p.bytes - sp.PerCell
			if sp.PerCell <= sp.CellMeta || sp.Base <= emptyState || p.capacity < 2 {
				return l, fmt.Errorf("KV part %d: %d and %d bytes for 1 and 2 cells, a cache of %d", i, p.bytes, two[i].bytes, p.capacity)
			}
		case partRecurrent:
			sp.Base = p.bytes
			if two[i].bytes != p.bytes || p.bytes <= 4+sp.CellMeta {
				return l, fmt.Errorf("recurrent part %d: %d and %d bytes for 1 and 2 tokens", i, p.bytes, two[i].bytes)
			}
		default:
			return l, fmt.Errorf("part %d of unknown kind %d", i, p.kind)
		}
		if p.maxRow <= 0 || p.maxRow > p.bytes {
			return l, fmt.Errorf("part %d: largest row %d of %d bytes", i, p.maxRow, p.bytes)
		}
		l.MaxRow = max(l.MaxRow, p.maxRow)
		l.Parts = append(l.Parts, sp)
	}
	return l, nil
}

// stateHead is what readStateHead read and checked.
type stateHead struct {
	raw   []byte // the bytes read, to be replayed to llama.cpp
	cells int
}

// errStateHead marks a state rejected by readStateHead.
var errStateHead = errors.New("bad state")

// readStateHead reads and checks the head of a state whose first part is a
// KV cache: one stream, as many cells as tokens, each cell one sequence, and
// positions 0..n−1 each exactly once (in any order: cells are in KV order,
// not position order). A state whose first part is recurrent has no cells to
// read ahead: its parts are checked as llama.cpp reads them. size is the
// bytes the payload holds; a state that cannot fit is refused before the
// slot is touched.
func readStateHead(r io.Reader, tokens []int32, nVocab, nCtx int, layout stateLayout, size int64) (stateHead, error) {
	h := stateHead{cells: len(tokens)}
	if err := checkStateTokens(tokens, nVocab, nCtx, layout, size); err != nil {
		return h, err
	}
	if layout.Parts[0].Kind == partRecurrent {
		return h, nil
	}
	meta := int(layout.Parts[0].CellMeta)
	hdr := make([]byte, 8)
	if n, err := io.ReadFull(r, hdr); err != nil {
		return h, truncated(int64(n), err)
	}
	h.raw = hdr
	if ns := binary.LittleEndian.Uint32(hdr); ns != 1 {
		return h, fmt.Errorf("%w: %w: the state has %d KV streams, want 1",
			iface.ErrBadRequest, errStateHead, ns)
	}
	cells := binary.LittleEndian.Uint32(hdr[4:])
	switch {
	case int64(cells) > int64(nCtx):
		return h, fmt.Errorf("%w: %w: the state holds %d cells, n_ctx is %d", iface.ErrBadRequest, errStateHead, cells, nCtx)
	case int(cells) != len(tokens):
		return h, fmt.Errorf("%w: %w: the state holds %d cells, the blob header %d tokens", iface.ErrBadRequest, errStateHead, cells, len(tokens))
	case cells == 0:
		return h, nil
	}
	raw := make([]byte, 8+int(cells)*meta)
	copy(raw, hdr)
	if n, err := io.ReadFull(r, raw[8:]); err != nil {
		return h, truncated(int64(8+n), err)
	}
	h.raw = raw
	seen := make([]bool, cells)
	for i := range h.cells {
		c := raw[8+i*meta:]
		pos := int32(binary.LittleEndian.Uint32(c))
		nSeq := binary.LittleEndian.Uint32(c[4:])
		switch {
		case nSeq != 1:
			return h, fmt.Errorf("%w: %w: cell %d belongs to %d sequences, want 1", iface.ErrBadRequest, errStateHead, i, nSeq)
		case pos < 0 || pos >= int32(cells):
			return h, fmt.Errorf("%w: %w: cell %d: position %d outside [0, %d)", iface.ErrBadRequest, errStateHead, i, pos, cells)
		case seen[pos]:
			return h, fmt.Errorf("%w: %w: cell %d: position %d repeated", iface.ErrBadRequest, errStateHead, i, pos)
		}
		seen[pos] = true
	}
	return h, nil
}

// checkStateTokens checks what a restore's blob header says against the
// engine: tokens in the vocabulary, no more than a slot holds, and a payload
// that can hold their state.
func checkStateTokens(tokens []int32, nVocab, nCtx int, layout stateLayout, size int64) error {
	if len(tokens) > nCtx {
		return fmt.Errorf("%w: %w: the state holds %d tokens, n_ctx is %d", iface.ErrBadRequest, errStateHead, len(tokens), nCtx)
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= nVocab {
			return fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)", iface.ErrBadRequest, t, i, nVocab)
		}
	}
	if need, _ := layout.sizes(len(tokens)); size < need {
		return fmt.Errorf("%w: the payload holds %d bytes, a state of %d cells needs %d", iface.ErrBadRequest, size, len(tokens), need)
	}
	return nil
}

// oneStream is a state llama.cpp wrote from a cache of nStream KV streams
// (one per sequence) as the one stream of sequence seq that the wire carries
// (shim.cpp does the same while streaming): the stream count becomes 1 and
// the other streams' empty cell counts go. A state not of that shape comes
// back as it is, for the caller's checks to refuse.
func oneStream(raw []byte, nStream, seq int) []byte {
	lead, trail := 4+4*seq, 4*(nStream-1-seq)
	if nStream <= 1 || len(raw) < lead+4+trail || binary.LittleEndian.Uint32(raw) != uint32(nStream) {
		return raw
	}
	for _, b := range slices.Concat(raw[4:lead], raw[len(raw)-trail:]) {
		if b != 0 {
			return raw
		}
	}
	out := binary.LittleEndian.AppendUint32(nil, 1)
	return append(out, raw[lead:len(raw)-trail]...)
}

// truncated describes a state that ended early (io.ErrUnexpectedEOF, a bad
// request) or a reader that failed (its error, not a bad request).
func truncated(off int64, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: state truncated at offset %d: %w", iface.ErrBadRequest, off, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("reading the state at offset %d: %w", off, err)
}
