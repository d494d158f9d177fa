package cudallama

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/hydra-engine/hydra-engine/iface"
)

// A llama.cpp per-sequence state of a plain (non-SWA, non-recurrent) KV cache,
// as this llama.cpp writes it (llama_kv_cache::state_write), little-endian:
//
//	u32 n_stream                       1 with kv_unified
//	per stream: u32 cell_count         0: nothing else for this stream
//	  cell_count × {i32 pos, u32 n_seq_id = 1, i32 seq_id}
//	  u32 v_trans, u32 n_layer
//	  per layer: i32 k_type, u64 k_row_bytes, cell_count K rows
//	  !v_trans, per layer: i32 v_type, u64 v_row_bytes, cell_count V rows
//	  v_trans,  per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v_gqa, then per
//	            embedding row the cells' elements
//
// So its size is affine in the number of cells: stateLayout.
//
// llama.cpp checks the layer count, types and row sizes on restore, but
// trusts the head: a cell count of 2^32−1 makes it reserve a batch that
// large, and odd positions corrupt the sequence. readStateHead checks the head
// first, against the blob's tokens, before llama.cpp sees a byte.
const (
	cellMetaSize = 12
	emptyState   = 8 // n_stream, cell_count = 0
)

// stateLayout is the size of a sequence's state as a function of its cells:
// emptyState for none, Base + cells×PerCell otherwise; and MaxRow, the
// largest block llama.cpp reads in one piece per cell (a layer's K or V row,
// or a transposed V's element), which sizes the restore ring. It is
// measured at load (stateLayout of the model, see Backend.Load).
type stateLayout struct {
	Base, PerCell, MaxRow int64
}

func (l stateLayout) size(cells int) int64 {
	if cells == 0 {
		return emptyState
	}
	return l.Base + int64(cells)*l.PerCell
}

// stateHead is what readStateHead read and checked.
type stateHead struct {
	raw   []byte // the bytes read, to be replayed to llama.cpp
	cells int
}

// errStateHead marks a state rejected by readStateHead.
var errStateHead = errors.New("bad state")

// readStateHead reads and checks the head of a state: one stream, as many
// cells as tokens, each cell one sequence, and positions 0..n−1 each exactly
// once (in any order: cells are in KV order, not position order). size is the
// bytes the payload holds; a state that cannot fit is refused before the slot
// is touched.
func readStateHead(r io.Reader, tokens []int32, nVocab, nCtx int, layout stateLayout, size int64) (stateHead, error) {
	var h stateHead
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
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= nVocab {
			return h, fmt.Errorf("%w: token %d at position %d is outside the vocabulary [0, %d)", iface.ErrBadRequest, t, i, nVocab)
		}
	}
	h.cells = int(cells)
	if need := layout.size(h.cells); size < need {
		return h, fmt.Errorf("%w: the payload holds %d bytes, a state of %d cells needs %d", iface.ErrBadRequest, size, h.cells, need)
	}
	if cells == 0 {
		return h, nil
	}
	meta := make([]byte, 8+int(cells)*cellMetaSize)
	copy(meta, hdr)
	if n, err := io.ReadFull(r, meta[8:]); err != nil {
		return h, truncated(int64(8+n), err)
	}
	h.raw = meta
	seen := make([]bool, cells)
	for i := range h.cells {
		c := meta[8+i*cellMetaSize:]
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

// maxRow walks a state written as above and returns its largest row (see
// stateLayout.MaxRow), checking that the rows account for every byte.
func maxRow(state []byte) (int64, error) {
	w := &stateWalker{b: state}
	var row int64
	// rows skips n rows of size bytes each.
	rows := func(n, size int64) {
		row = max(row, size)
		if size > 0 && n > int64(len(w.b)-w.off)/size {
			w.fail(fmt.Errorf("%d rows of %d bytes at offset %d overrun a state of %d bytes", n, size, w.off, len(w.b)))
		}
		w.skip(n * size)
	}
	// The loops stop at the first error: the counts come from the state.
	for st, streams := int64(0), w.u32(); st < streams && w.err == nil; st++ {
		cells := w.u32()
		for c := int64(0); c < cells && w.err == nil; c++ { // pos, n_seq_id, seq_ids
			w.skip(4)
			w.skip(4 * w.u32())
		}
		if cells == 0 {
			continue
		}
		vTrans, layers := w.u32(), w.u32()
		for l := int64(0); l < 2*layers && w.err == nil; l++ { // K then V: type, row size, rows
			w.skip(4)
			if l < layers || vTrans == 0 {
				rows(cells, w.u64())
				continue
			}
			el, embd := w.u32(), w.u32() // transposed V: rows of elements
			rows(embd*cells, el)
		}
	}
	if w.err == nil && w.off != len(state) {
		w.fail(fmt.Errorf("a state of %d bytes holds %d after its last layer", len(state), len(state)-w.off))
	}
	return row, w.err
}

// stateWalker reads a state's fields; after the first error every read
// gives 0 and the error stays.
type stateWalker struct {
	b   []byte
	off int
	err error
}

func (w *stateWalker) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *stateWalker) take(n int64) []byte {
	if w.err == nil && (n < 0 || int64(len(w.b)-w.off) < n) {
		w.fail(fmt.Errorf("a state of %d bytes ends at offset %d, %d more expected", len(w.b), w.off, n))
	}
	if w.err != nil {
		return nil
	}
	b := w.b[w.off : w.off+int(n)]
	w.off += int(n)
	return b
}

func (w *stateWalker) skip(n int64) { w.take(n) }

func (w *stateWalker) u32() int64 {
	if b := w.take(4); b != nil {
		return int64(binary.LittleEndian.Uint32(b))
	}
	return 0
}

func (w *stateWalker) u64() int64 {
	b := w.take(8)
	if b == nil {
		return 0
	}
	v := binary.LittleEndian.Uint64(b)
	if v > 1<<40 {
		w.fail(fmt.Errorf("row size %d at offset %d", v, w.off-8))
		return 0
	}
	return int64(v)
}

// truncated describes a state that ended early (io.ErrUnexpectedEOF, a bad
// request) or a reader that failed (its error, not a bad request).
func truncated(off int64, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: state truncated at offset %d: %w", iface.ErrBadRequest, off, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("reading the state at offset %d: %w", off, err)
}
