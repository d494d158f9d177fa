package sched

import (
	"slices"
	"testing"
)

// TestBatchAdd: runs of tokens take consecutive rows and positions, with
// logits for none, the last or every row of each run.
func TestBatchAdd(t *testing.T) {
	var b Batch
	b.Add([]int32{7, 8, 9}, 10, 2, RowsLast)
	b.Add([]int32{5}, 40, 0, RowsLast)
	b.Add([]int32{1, 2}, 3, 1, RowsAll)
	b.Add([]int32{4, 4}, 0, 3, RowsNone)
	want := Batch{Token: []int32{7, 8, 9, 5, 1, 2, 4, 4}, Pos: []int32{10, 11, 12, 40, 3, 4, 0, 1},
		Seq: []int32{2, 2, 2, 0, 1, 1, 3, 3}, Logits: []bool{false, false, true, true, true, true, false, false}}
	if b.Len() != 8 || !slices.Equal(b.Token, want.Token) || !slices.Equal(b.Pos, want.Pos) ||
		!slices.Equal(b.Seq, want.Seq) || !slices.Equal(b.Logits, want.Logits) {
		t.Fatalf("batch %+v\nwant %+v", b, want)
	}
	b.Reset()
	if b.Len() != 0 || len(b.Logits) != 0 {
		t.Fatalf("reset batch %+v", b)
	}
}
