package cudallama

import (
	"encoding/binary"
	"testing"
)

// kvPart writes a KV part of the given cells' positions and per bytes of
// data each, as llama.cpp lays one out (one stream, the cells' metadata,
// then the rows).
func kvPart(positions []int, per int) []byte {
	var b []byte
	u32 := func(v int) { b = binary.LittleEndian.AppendUint32(b, uint32(v)) }
	u32(1)
	u32(len(positions))
	for _, p := range positions {
		u32(p)
		u32(1)
		u32(0)
	}
	if len(positions) > 0 {
		b = append(b, make([]byte, 16+per*len(positions))...)
	}
	return b
}

func positions(lo, hi int) []int {
	var ps []int
	for p := lo; p < hi; p++ {
		ps = append(ps, p)
	}
	return ps
}

func TestFirstPos(t *testing.T) {
	kv := statePart{Kind: partKV, Base: 8 + 16, PerCell: cellMetaSize + 32, Empty: emptyState, CellMeta: cellMetaSize, Capacity: 1 << 20}
	win := kv
	win.SWA, win.Capacity = true, 64
	rec := statePart{Kind: partRecurrent, Base: 100, Empty: 4, CellMeta: cellMetaSize}
	plain := stateLayout{Parts: []statePart{kv}}
	iswa := stateLayout{Parts: []statePart{kv, win}}
	hybrid := stateLayout{Parts: []statePart{kv, rec}}
	ring := append(positions(70, 100), positions(40, 70)...) // a window's cells in ring order
	for _, c := range []struct {
		name   string
		l      stateLayout
		state  []byte
		n      int
		want   int
		broken bool
	}{
		{"plain", plain, kvPart(positions(0, 50), 32), 50, 0, false},
		{"empty", plain, kvPart(nil, 32), 0, -1, false},
		{"window: the latest first position", iswa, append(kvPart(positions(0, 100), 32), kvPart(ring, 32)...), 100, 40, false},
		{"hybrid: the recurrent state's last token", hybrid, append(kvPart(positions(0, 20), 32), make([]byte, 100)...), 20, 19, false},
		{"truncated", plain, kvPart(positions(0, 50), 32)[:300], 50, -1, true},
		{"trailing bytes", plain, append(kvPart(positions(0, 5), 32), 0), 5, -1, true},
	} {
		got, err := c.l.firstPos(c.state, c.n)
		if (err != nil) != c.broken || (!c.broken && got != c.want) {
			t.Errorf("%s: %d, %v; want %d (an error: %v)", c.name, got, err, c.want, c.broken)
		}
	}
}
