//go:build llama && cgo

package llama

/*
#include "llama.h"
*/
import "C"

import "unsafe"

// Context is a llama_context: the adapter's decoding context or a draft's.
type Context struct{ p *C.struct_llama_context }

// ContextOf wraps a *llama_context the adapter created, until the context's
// creation moves here.
func ContextOf(p unsafe.Pointer) *Context { return &Context{p: (*C.struct_llama_context)(p)} }

// Ptr is the *llama_context, for the adapter's cgo that has not moved here yet.
func (c *Context) Ptr() unsafe.Pointer { return unsafe.Pointer(c.p) }
