//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "llama.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"
)

// The memory's operations by sequence and position, as llama_memory_seq_*
// make them; the scheduler's and the slots' rules (internal/kv) call them.

// SeqRm empties the sequence.
func (c *Context) SeqRm(seq int) {
	C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), -1, -1)
}

// SeqRmFrom removes positions p0 and after from the sequence; false where
// the memory cannot be cut there (a recurrent state, which holds its last
// token), the sequence then as it was.
func (c *Context) SeqRmFrom(seq, p0 int) bool {
	return bool(C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), -1))
}

// SeqRmRange removes positions [p0, p1) from the sequence.
func (c *Context) SeqRmRange(seq, p0, p1 int) {
	C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1))
}

// SeqShift adds delta to the positions [p0, p1) of the sequence; the keys
// are re-rotated by the next llama_decode.
func (c *Context) SeqShift(seq, p0, p1, delta int) {
	C.llama_memory_seq_add(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1), C.llama_pos(delta))
}

// SeqCp shares positions [p0, p1) of src with dst (in a unified cache the
// cells gain a sequence id; no KV is copied). Between streams llama.cpp
// copies the whole stream, and only for p0 = p1 = -1.
func (c *Context) SeqCp(src, dst, p0, p1 int) {
	C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), C.llama_pos(p0), C.llama_pos(p1))
}

// SeqPosMin is the sequence's first position the memory still holds (a
// sliding window drops the positions before its window); -1 if empty.
func (c *Context) SeqPosMin(seq int) int {
	return int(C.llama_memory_seq_pos_min(c.mem, C.llama_seq_id(seq)))
}

// SeqPosMax is the sequence's last position in memory; -1 if empty.
func (c *Context) SeqPosMax(seq int) int {
	return int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq)))
}

// CanShift reports whether the cache can move positions (context shift,
// cache reuse).
func (c *Context) CanShift() bool { return bool(C.llama_memory_can_shift(c.mem)) }

// Clear empties every sequence of the memory, its data too.
func (c *Context) Clear() { C.llama_memory_clear(c.mem, true) }

// PartialState is the part of the sequence's memory that cannot be cut back
// (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: a hybrid's recurrent rows, a sliding
// window's cache), in host memory: a context checkpoint's bytes.
func (c *Context) PartialState(seq int) ([]byte, error) { return c.PartialStateInto(seq, nil) }

// PartialStateInto is PartialState written into buf's memory where it fits
// (a speculating slot's rollback, saved every step), else into new memory.
func (c *Context) PartialStateInto(seq int, buf []byte) ([]byte, error) {
	const flags = C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
	n := C.llama_state_seq_get_size_ext(c.p, C.llama_seq_id(seq), flags)
	if n == 0 {
		return nil, fmt.Errorf("llama.cpp has no partial state of sequence %d", seq)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, int(n))
	}
	buf = buf[:int(n)]
	got := C.llama_state_seq_get_data_ext(c.p, (*C.uint8_t)(unsafe.Pointer(&buf[0])), n, C.llama_seq_id(seq), flags)
	if got != n {
		return nil, fmt.Errorf("llama.cpp wrote %d bytes of sequence %d's partial state, announced %d: %s", got, seq, n, LastError())
	}
	return buf, nil
}

// SetPartialState loads a PartialState into the sequence, replacing the
// part it covers; the rest of the memory is left as it is.
func (c *Context) SetPartialState(seq int, data []byte) error {
	if len(data) == 0 {
		return errors.New("empty partial state")
	}
	got := C.llama_state_seq_set_data_ext(c.p, (*C.uint8_t)(unsafe.Pointer(&data[0])), C.size_t(len(data)), C.llama_seq_id(seq),
		C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
	if int(got) != len(data) {
		return fmt.Errorf("llama.cpp read %d of the %d bytes of sequence %d's partial state: %s", got, len(data), seq, LastError())
	}
	return nil
}

// seqStateHead is the head llama_state_seq_get_data writes before the
// sequence's memory: a magic number and the source sequence id. The wire's
// state is the memory's serialisation alone (shim.cpp), which restores
// into any slot.
const (
	seqStateHead  = 8
	seqStateMagic = 0xaf143cd8
)

// StateSize is the bytes of the sequence's state as one stream (shim.cpp):
// llama.cpp's, less its head and the other streams' empty cell counts.
func (c *Context) StateSize(seq int) int64 {
	return int64(C.llama_state_seq_get_size(c.p, C.llama_seq_id(seq))) - seqStateHead - 4*int64(c.nStream-1)
}

// StateData is llama.cpp's own llama_state_seq_get_data without its head,
// checked: the memory's serialisation with every KV stream, the reference
// the tests compare the streamed bytes with (the adapter makes it one
// stream).
func (c *Context) StateData(seq int) ([]byte, error) {
	n := c.StateSize(seq) + seqStateHead + 4*int64(c.nStream-1)
	buf := C.malloc(C.size_t(max(n, 1)))
	defer C.free(buf)
	got := C.llama_state_seq_get_data(c.p, (*C.uint8_t)(buf), C.size_t(n), C.llama_seq_id(seq))
	raw := C.GoBytes(buf, C.int(got))
	if len(raw) < seqStateHead || binary.LittleEndian.Uint32(raw) != seqStateMagic || int32(binary.LittleEndian.Uint32(raw[4:])) != int32(seq) {
		return nil, fmt.Errorf("llama.cpp's state of sequence %d does not start with its head (magic %#x, the sequence id): % x",
			seq, seqStateMagic, raw[:min(len(raw), seqStateHead)])
	}
	return raw[seqStateHead:], nil
}
