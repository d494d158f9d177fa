//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "spec.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

// DraftParams are a Draft's parameters: llama-server's speculative ones.
type DraftParams struct {
	NCtx     int // the draft context's cells, shared by its sequences
	NBatch   int // tokens one catch-up evaluation takes, and the rows Process takes
	NSeq     int // the sequences (the target's slots)
	NThreads int
	NMax     int     // draft_max: no draft is longer
	NMin     int     // draft_min: a shorter draft is dropped
	PMin     float32 // draft_p_min: a draft stops at a less likely token
	// Types are llama-server's --spec-type names.
	Types []string
	// NgramSimple and NgramMap are --spec-ngram-simple-size-n/-m and
	// --spec-ngram-map-k-size-n/-m (the k4v map's too); 0: llama.cpp's
	// default.
	NgramSimple, NgramMap [2]int
	// MTP drafts with the target's multi-token-prediction block (draft-mtp,
	// the target's model loaded with ModelParams.MTP), fed by Process.
	MTP bool
}

// Draft is llama.cpp's speculative drafting (common/speculative.h, spec.cpp)
// beside a target context: its draft-simple over a draft model's context,
// whose sequence i is the target's slot i, its draft-mtp over the target's
// own MTP block, its n-gram lookups over each sequence's tokens.
type Draft struct {
	p     *C.hydra_spec
	batch C.struct_llama_batch // Process's copy of the target's batch (draft-mtp)
	nRows int                  // the rows batch holds
	// scratch of a Draft call, reused
	seqs, past, last, nMax, hist, histOff, out, nOut []int32
	stride                                           int
}

// NewDraft makes llama.cpp's speculative state of p.Types beside target,
// with the draft context of dft (Model{}: none, for n-gram types or MTP),
// which the caller owns and frees after the Draft; the error is llama.cpp's
// refusal (e.g. the vocabularies differ).
func NewDraft(dft Model, target *Context, p DraftParams) (*Draft, error) {
	types := C.CString(strings.Join(p.Types, ","))
	defer C.free(unsafe.Pointer(types))
	cp := C.struct_hydra_spec_params{
		n_ctx: C.uint32_t(p.NCtx), n_batch: C.uint32_t(p.NBatch), n_seq: C.uint32_t(p.NSeq),
		n_threads: C.int32_t(p.NThreads), n_max: C.int32_t(p.NMax), n_min: C.int32_t(p.NMin), p_min: C.float(p.PMin),
		types:          types,
		ngram_simple_n: C.uint16_t(p.NgramSimple[0]), ngram_simple_m: C.uint16_t(p.NgramSimple[1]),
		ngram_map_n: C.uint16_t(p.NgramMap[0]), ngram_map_m: C.uint16_t(p.NgramMap[1]),
	}
	if p.MTP {
		cp.mtp = 1
	}
	var msg [256]C.char
	s := C.hydra_spec_new(dft.p, target.p, &cp, &msg[0], C.size_t(len(msg)))
	if s == nil {
		return nil, errors.New(C.GoString(&msg[0]))
	}
	d := &Draft{p: s, stride: p.NMax}
	if p.MTP {
		d.batch, d.nRows = C.llama_batch_init(C.int32_t(p.NBatch), 0, 1), p.NBatch
	}
	return d, nil
}

// Free releases the draft context and llama.cpp's speculative state, not
// the draft model.
func (d *Draft) Free() {
	C.hydra_spec_free(d.p)
	if d.nRows > 0 {
		C.llama_batch_free(d.batch)
	}
}

// Context is the draft context: the draft model's, or the MTP block's; nil
// without one.
func (d *Draft) Context() *Context {
	c := C.hydra_spec_ctx(d.p)
	if c == nil {
		return nil
	}
	return wrapContext(c)
}

// Begin starts sequence seq's generation after prompt (the n-gram maps
// index it).
func (d *Draft) Begin(seq int, prompt []int32) {
	C.hydra_spec_begin(d.p, C.int32_t(seq), (*C.llama_token)(unsafe.Pointer(unsafe.SliceData(prompt))), C.int32_t(len(prompt)))
}

// Accept tells the implementation that drafted seq's last draft how many of
// its tokens the target accepted.
func (d *Draft) Accept(seq, n int) { C.hydra_spec_accept(d.p, C.int32_t(seq), C.int32_t(n)) }

// PosMax is the last position of seq the draft context holds; -1 when none
// or without a draft context.
func (d *Draft) PosMax(seq int) int { return int(C.hydra_spec_pos_max(d.p, C.int32_t(seq))) }

// SeqRm removes seq's draft cells from position p0 on (0: all of them).
func (d *Draft) SeqRm(seq, p0 int) { C.hydra_spec_seq_rm(d.p, C.int32_t(seq), C.int32_t(p0)) }

// DraftDecodeError is the draft context's llama_decode's failure, its code.
type DraftDecodeError int

func (e DraftDecodeError) Error() string { return fmt.Sprintf("llama_decode failed (%d)", int(e)) }

// Eval evaluates toks at positions pos in sequences seqs (as many of each)
// in the draft context, without logits, in batches of NBatch; a
// DraftDecodeError where llama_decode failed.
func (d *Draft) Eval(toks, pos, seqs []int32) error {
	if len(toks) == 0 {
		return nil
	}
	if len(pos) != len(toks) || len(seqs) != len(toks) {
		return errors.New("the draft's tokens, positions and sequences differ in length")
	}
	if r := C.hydra_spec_eval(d.p, (*C.llama_token)(unsafe.Pointer(&toks[0])), (*C.llama_pos)(unsafe.Pointer(&pos[0])),
		(*C.llama_seq_id)(unsafe.Pointer(&seqs[0])), C.int32_t(len(toks))); r != 0 {
		return DraftDecodeError(r)
	}
	return nil
}

// ErrMTPProcess is an MTP block that could not evaluate a batch.
var ErrMTPProcess = errors.New("the MTP block could not evaluate the batch")

// Process hands the batch the target context just evaluated (its rows:
// token, position, sequence, whether it output) to the MTP block
// (draft-mtp): each sequence's cells from its first position in the batch
// on are removed, then its tokens are evaluated with the target's hidden
// states of the positions before them, so that the block holds what the
// target does. The rows must be those of the target's last evaluation,
// whose hidden states are read.
func (d *Draft) Process(toks, pos, seqs []int32, logits []bool) error {
	n := len(toks)
	if n == 0 || d.nRows == 0 {
		return nil
	}
	if n > d.nRows || len(pos) != n || len(seqs) != n || len(logits) != n {
		return ErrMTPProcess
	}
	b := &d.batch
	copy(unsafe.Slice((*int32)(unsafe.Pointer(b.token)), n), toks)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(b.pos)), n), pos)
	nSeq, seqIDs, out := unsafe.Slice(b.n_seq_id, n), unsafe.Slice(b.seq_id, n), unsafe.Slice(b.logits, n)
	for i := range n {
		nSeq[i], *seqIDs[i], out[i] = 1, C.llama_seq_id(seqs[i]), 0
		if logits[i] {
			out[i] = 1
		}
	}
	b.n_tokens = C.int32_t(n)
	if C.hydra_spec_process(d.p, &d.batch) != 0 { // &d.batch, so that cgo checks the field alone, not the Draft
		return ErrMTPProcess
	}
	return nil
}

// DraftSeq is one sequence's drafting: sequence Seq, whose draft context
// holds positions [0, Past), continues after Last (evaluated at Past
// first) with at most Max tokens; Hist is its tokens so far, which the
// n-gram types read (nil without them).
type DraftSeq struct {
	Seq, Past, Last, Max int32
	Hist                 []int32
}

// Draft drafts for the sequences at once and returns their drafts, in
// order, at most NMax tokens each; the drafts are the Draft's memory until
// its next Draft.
func (d *Draft) Draft(seqs []DraftSeq) [][]int32 {
	n := len(seqs)
	if n == 0 {
		return nil
	}
	d.seqs, d.past, d.last, d.nMax = d.seqs[:0], d.past[:0], d.last[:0], d.nMax[:0]
	d.hist, d.histOff = d.hist[:0], d.histOff[:0]
	for _, s := range seqs {
		d.seqs, d.past, d.last, d.nMax = append(d.seqs, s.Seq), append(d.past, s.Past), append(d.last, s.Last), append(d.nMax, s.Max)
		d.histOff = append(d.histOff, int32(len(d.hist)))
		d.hist = append(d.hist, s.Hist...)
	}
	d.histOff = append(d.histOff, int32(len(d.hist)))
	var hist *C.llama_token // nil: no n-gram type reads any
	if len(d.hist) > 0 {
		hist = (*C.llama_token)(unsafe.Pointer(&d.hist[0]))
	}
	stride := max(d.stride, 1)
	d.out = append(d.out[:0], make([]int32, n*stride)...)
	d.nOut = append(d.nOut[:0], make([]int32, n)...)
	C.hydra_spec_draft(d.p, C.int32_t(n), (*C.llama_seq_id)(unsafe.Pointer(&d.seqs[0])), (*C.llama_pos)(unsafe.Pointer(&d.past[0])),
		(*C.llama_token)(unsafe.Pointer(&d.last[0])), (*C.int32_t)(unsafe.Pointer(&d.nMax[0])), hist, (*C.int32_t)(unsafe.Pointer(&d.histOff[0])),
		(*C.llama_token)(unsafe.Pointer(&d.out[0])), C.int32_t(stride), (*C.int32_t)(unsafe.Pointer(&d.nOut[0])))
	drafts := make([][]int32, n)
	for i := range drafts {
		drafts[i] = d.out[i*stride : i*stride+int(d.nOut[i]) : i*stride+int(d.nOut[i])]
	}
	return drafts
}
