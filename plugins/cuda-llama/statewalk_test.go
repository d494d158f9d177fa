package cudallama

import (
	"encoding/binary"
	"fmt"
)

// maxRow walks a plain cache's state (statehead.go) and returns its largest row (see
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
