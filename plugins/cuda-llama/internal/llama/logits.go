//go:build llama && cgo

package llama

/*
#include "llama.h"
*/
import "C"

import "unsafe"

// Logits is row's logits (nVocab of them; row -1: the last row), in
// llama.cpp's memory until the context's next evaluation, so that a sampler
// reads them in place; nil where the row has none.
func (c *Context) Logits(row, nVocab int) []float32 {
	p := C.llama_get_logits_ith(c.p, C.int32_t(row))
	if p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), nVocab)
}
