package sched

// Batch is the tokens one evaluation takes, as llama_batch holds them: row
// i is token Token[i] at position Pos[i] of sequence Seq[i], with its
// logits computed where Logits[i].
type Batch struct {
	Token, Pos, Seq []int32
	Logits          []bool
}

// Rows says which rows of a run of tokens compute logits.
type Rows int

const (
	RowsNone Rows = iota // replayed tokens, sampled already
	RowsLast             // a prompt's last chunk, a decoder's pending token
	RowsAll              // a pending token and its draft: each is verified from the row before it
)

// Reset empties the batch, keeping its memory.
func (b *Batch) Reset() {
	b.Token, b.Pos, b.Seq, b.Logits = b.Token[:0], b.Pos[:0], b.Seq[:0], b.Logits[:0]
}

// Len is the batch's rows.
func (b *Batch) Len() int { return len(b.Token) }

// Add appends toks at positions pos0.. of sequence seq, their logits as
// rows says.
func (b *Batch) Add(toks []int32, pos0, seq int, rows Rows) {
	for i, t := range toks {
		b.Token = append(b.Token, t)
		b.Pos = append(b.Pos, int32(pos0+i))
		b.Seq = append(b.Seq, int32(seq))
		b.Logits = append(b.Logits, rows == RowsAll || (rows == RowsLast && i == len(toks)-1))
	}
}
