package cudallama

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
)

// synthState writes a state as llama.cpp does (see statehead.go): cells
// cells, K rows of kRow bytes per layer, then V rows of vRow bytes or, with
// vElem > 0, a transposed V of embd rows of vElem-byte elements.
func synthState(cells, layers int, kRow, vRow, vElem, embd int) []byte {
	var b []byte
	u32 := func(v int) { b = binary.LittleEndian.AppendUint32(b, uint32(v)) }
	u64 := func(v int) { b = binary.LittleEndian.AppendUint64(b, uint64(v)) }
	u32(1)
	u32(cells)
	for i := range cells {
		u32(i)
		u32(1)
		u32(0)
	}
	u32(min(vElem, 1))
	u32(layers)
	for range layers {
		u32(1)
		u64(kRow)
		b = append(b, make([]byte, cells*kRow)...)
	}
	for range layers {
		u32(1)
		if vElem == 0 {
			u64(vRow)
			b = append(b, make([]byte, cells*vRow)...)
			continue
		}
		u32(vElem)
		u32(embd)
		b = append(b, make([]byte, embd*cells*vElem)...)
	}
	return b
}

func TestMaxRow(t *testing.T) {
	for _, c := range []struct {
		name  string
		state []byte
		want  int64
	}{
		{"rows", synthState(3, 2, 256, 512, 0, 0), 512},
		{"transposed V", synthState(5, 3, 128, 0, 2, 64), 128},
		{"empty", []byte{1, 0, 0, 0, 0, 0, 0, 0}, 0},
		{"an empty stream first", append([]byte{2, 0, 0, 0, 0, 0, 0, 0}, synthState(2, 1, 64, 32, 0, 0)[4:]...), 64},
	} {
		got, err := maxRow(c.state)
		if err != nil || got != c.want {
			t.Errorf("%s: %d, %v; want %d", c.name, got, err, c.want)
		}
	}
	good := synthState(2, 2, 64, 64, 0, 0)
	huge := synthState(1, 1, 64, 64, 0, 0)
	binary.LittleEndian.PutUint64(huge[8+12+8+4:], 1<<39) // the K row size
	for name, bad := range map[string][]byte{
		"truncated":     good[:len(good)-1],
		"trailing byte": append(append([]byte{}, good...), 0),
		"huge row":      huge,
		"no layers":     good[:8+24+4],
	} {
		if _, err := maxRow(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzReadStateHead feeds client bytes to the head check, which runs before
// llama.cpp sees a byte: no panic, and what it accepts is what it promises.
func FuzzReadStateHead(f *testing.F) {
	f.Add(synthState(3, 1, 8, 8, 0, 0), 3)
	f.Add(synthState(1, 2, 4, 0, 2, 3), 1)
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0}, 0)
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255}, 2)
	layout := plainLayout(16, 12+2*8, 8)
	f.Fuzz(func(t *testing.T, state []byte, ntok int) {
		ntok = min(max(ntok, 0), 64)
		tokens := make([]int32, ntok)
		for i := range tokens {
			tokens[i] = int32(i % 7)
		}
		h, err := readStateHead(bytes.NewReader(state), tokens, 7, 64, layout, int64(len(state)))
		if err != nil {
			return
		}
		if h.cells != ntok || !bytes.HasPrefix(state, h.raw) || len(h.raw) != 8+12*h.cells*min(h.cells, 1) {
			t.Fatalf("accepted %d cells for %d tokens, head of %d bytes", h.cells, ntok, len(h.raw))
		}
		if layout.size(h.cells) > int64(len(state)) {
			t.Fatalf("accepted %d cells in a payload of %d bytes", h.cells, len(state))
		}
	})
}

// FuzzMaxRow: no panic, and a row no larger than the state.
func FuzzMaxRow(f *testing.F) {
	f.Add(synthState(3, 2, 256, 512, 0, 0))
	f.Add(synthState(5, 3, 128, 0, 2, 64))
	f.Fuzz(func(t *testing.T, state []byte) {
		row, err := maxRow(state)
		if err == nil && row > int64(len(state)) {
			t.Fatalf("row of %d bytes in a state of %d", row, len(state))
		}
	})
}

// TestOneStream: a state of nStream streams, the sequence's own holding the
// cells, becomes the one-stream state; anything else comes back unchanged.
func TestOneStream(t *testing.T) {
	one := synthState(3, 2, 8, 8, 0, 0)
	empty := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	multi := func(state []byte, nStream, seq int) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(nStream))
		b = append(b, make([]byte, 4*seq)...)
		b = append(b, state[4:]...)
		return append(b, make([]byte, 4*(nStream-1-seq))...)
	}
	for _, tc := range []struct {
		name          string
		raw, want     []byte
		nStream, seqs int
	}{
		{"first of 4", multi(one, 4, 0), one, 4, 0},
		{"middle of 4", multi(one, 4, 2), one, 4, 2},
		{"last of 4", multi(one, 4, 3), one, 4, 3},
		{"empty", multi(empty, 5, 1), empty, 5, 1},
		{"one stream already", one, one, 1, 0},
		{"stream count not the cache's", multi(one, 3, 1), multi(one, 3, 1), 4, 1},
		{"cells in another stream", multi(one, 4, 1), multi(one, 4, 1), 4, 2},
		{"too short", []byte{4, 0, 0, 0}, []byte{4, 0, 0, 0}, 4, 0},
	} {
		if got := oneStream(tc.raw, tc.nStream, tc.seqs); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: got % x…, want % x…", tc.name, got[:min(len(got), 16)], tc.want[:min(len(tc.want), 16)])
		}
	}
}

// TestMeasureParts: a hybrid state's layout from its parts measured at 0, 1
// and 2 cells, its sizes and the rules a restore is held to; and what no part
// can be is refused.
func TestMeasureParts(t *testing.T) {
	kv := func(bytes int64) measuredPart {
		return measuredPart{kind: partKV, cellMeta: 24, capacity: 4096, bytes: bytes, maxRow: 256}
	}
	rec := func(bytes int64) measuredPart {
		return measuredPart{kind: partRecurrent, cellMeta: 8, capacity: 3, bytes: bytes, maxRow: 8192}
	}
	swa := func(bytes int64) measuredPart {
		return measuredPart{kind: partKV, cellMeta: 12, capacity: 96, swa: true, bytes: bytes, maxRow: 64}
	}
	l, err := measureParts("hybrid", []measuredPart{kv(8), swa(8), rec(84)},
		[]measuredPart{kv(8 + 24 + 8 + 1000), swa(8 + 12 + 8 + 200), rec(84 + 12 + 8192)},
		[]measuredPart{kv(8 + 2*24 + 8 + 2000), swa(8 + 2*12 + 8 + 400), rec(84 + 12 + 8192)})
	if err != nil {
		t.Fatal(err)
	}
	if l.MaxRow != 8192 || !l.recurrent() || !l.window() || l.perToken() != 1024 {
		t.Fatalf("layout %+v: max row %d, recurrent %v, window %v, per token %d", l, l.MaxRow, l.recurrent(), l.window(), l.perToken())
	}
	if lo, hi := l.sizes(0); lo != 100 || hi != 100 {
		t.Errorf("empty: %d to %d bytes, want 100", lo, hi)
	}
	lo, hi := l.sizes(200)
	if want := int64(16 + 200*1024 + 16 + 212 + 96 + 8192); lo != want || hi != int64(16+200*1024+16+96*212+96+8192) {
		t.Errorf("200 tokens: %d to %d bytes, want from %d", lo, hi, want)
	}
	r := l.rules(200)
	if r[0].MinCells != 200 || r[0].MaxCells != 200 || r[1].MinCells != 1 || r[1].MaxCells != 96 || r[2].MinCells != 1 || r[2].MaxCells != 1 {
		t.Errorf("rules %+v", r)
	}
	withFields := func(p measuredPart, v byte) measuredPart { p.fields = []byte{0, 0, 0, 0, v, 0, 0, 0}; return p }
	if l, err := measureParts("kv", []measuredPart{kv(8)}, []measuredPart{withFields(kv(1040), 1)}, []measuredPart{withFields(kv(2064), 1)}); err != nil ||
		!bytes.Equal(l.rules(3)[0].Fields, []byte{0, 0, 0, 0, 1, 0, 0, 0}) {
		t.Errorf("the rows' fields measured: %v, %v", l, err)
	}
	for _, bad := range [][3][]measuredPart{
		{{kv(12)}, {kv(1040)}, {kv(2080)}},                              // an empty KV part that is not its two counts
		{{kv(8)}, {kv(1040)}, {kv(1040)}},                               // no bytes per cell
		{{rec(84)}, {rec(84 + 12 + 8192)}, {rec(84 + 24 + 8192)}},       // a recurrent part that grows
		{{kv(8), rec(84)}, {kv(1040)}, {kv(2080)}},                      // parts that come and go
		{{kv(8)}, {withFields(kv(1040), 1)}, {withFields(kv(2064), 2)}}, // rows' fields that vary with the cells
	} {
		if _, err := measureParts("x", bad[0], bad[1], bad[2]); err == nil {
			t.Errorf("%+v measured", bad)
		}
	}
}

// TestDescribeLayout: the layout names the model, the cache and each part,
// flat, and leaves out what depends on n_ctx (a cache's cells).
func TestDescribeLayout(t *testing.T) {
	l := stateLayout{Memory: "hybrid", MaxRow: 8192, Parts: []statePart{
		{Kind: partKV, Base: 40, PerCell: 1024, Empty: 8, CellMeta: 24, Capacity: 4096},
		{Kind: partRecurrent, Base: 8292, Empty: 84, CellMeta: 8, Capacity: 3},
	}}
	m := layoutModel{Arch: "qwen35moe", Layers: 40, Embd: 2048, TypeK: "q8_0", TypeV: "q8_0", Vocab: 151936}
	var got map[string]any
	if err := json.Unmarshal([]byte(l.describe(m)), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"arch": "qwen35moe", "memory": "hybrid", "parts": "kv+recurrent", "n_layer": 40.0, "n_embd": 2048.0,
		"cache_type_k": "q8_0", "cache_type_v": "q8_0", "v_trans": false, "kv_bytes_per_token": 1024.0, "kv_cell_meta": 24.0,
		"recurrent_bytes": 8292.0, "state_logits": 151936.0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layout %v, want %v", got, want)
	}
	before := l.describe(m)
	l.Parts = slices.Clone(l.Parts)
	l.Parts[0].Capacity, l.MaxRow = 8192, 4096
	if a, b := before, l.describe(m); a != b {
		t.Errorf("another cache size names another layout: %s, %s", a, b)
	}
}

// TestVTransOf reads the V layout after a one-token state's cell, and
// refuses what is not one.
func TestVTransOf(t *testing.T) {
	l := plainLayout(16, 12+2*8, 8)
	for _, v := range []int{0, 1} {
		s := synthState(1, 2, 8, 8, v*2, 4)
		if got, err := vTransOf(l, s); err != nil || got != (v == 1) {
			t.Errorf("v_trans %d: %v, %v", v, got, err)
		}
	}
	if _, err := vTransOf(l, synthState(2, 2, 8, 8, 0, 0)); err == nil {
		t.Error("a two-cell state read as one")
	}
	bad := synthState(1, 2, 8, 8, 0, 0)
	binary.LittleEndian.PutUint32(bad[8+cellMetaSize:], 7)
	if _, err := vTransOf(l, bad); err == nil {
		t.Error("v_trans 7 read")
	}
	if got, err := vTransOf(stateLayout{Parts: []statePart{{Kind: partRecurrent}}}, nil); err != nil || got {
		t.Errorf("a recurrent first part: %v, %v", got, err)
	}
}

// TestLockFrom: a restore keeps the context lock from the first recurrent
// part's offset; without one, never; with a part of varying size after it,
// throughout.
func TestLockFrom(t *testing.T) {
	kvPart := statePart{Kind: partKV, Base: 8, PerCell: 100, Empty: 8, CellMeta: cellMetaSize, Capacity: 1 << 20}
	swa := kvPart
	swa.SWA, swa.Capacity = true, 32
	rec := statePart{Kind: partRecurrent, Base: 5000, Empty: 4}
	for _, c := range []struct {
		name  string
		parts []statePart
		n     int
		want  func(size int64) int64
	}{
		{"plain", []statePart{kvPart}, 50, func(size int64) int64 { return size }},
		{"hybrid", []statePart{kvPart, rec}, 50, func(size int64) int64 { return size - 5000 }},
		{"hybrid, empty", []statePart{kvPart, rec}, 0, func(size int64) int64 { return size - 4 }},
		{"recurrent first, a window after", []statePart{rec, swa}, 50, func(int64) int64 { return 0 }},
		{"recurrent first, a plain cache after", []statePart{rec, kvPart}, 50, func(size int64) int64 { return 0 }},
	} {
		l := stateLayout{Parts: c.parts}
		size := l.size(c.n)
		if got, want := l.lockFrom(size, c.n), c.want(size); got != want {
			t.Errorf("%s: lockFrom %d of %d, want %d", c.name, got, size, want)
		}
	}
}
