//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include "ggml-backend.h"
#include "swap.h"
*/
import "C"

import (
	"errors"
	"time"
	"unsafe"
)

// Places of a weight's copy (swap.h): where llama.cpp placed it, on the
// peer device, or, to Swap.Apply, each weight's own (also: each keeps its
// source).
const (
	PlaceHome = int(C.HYDRA_HOME)
	PlacePeer = int(C.HYDRA_PEER)
	Keep      = int(C.HYDRA_KEEP)
)

// Swap is a loaded model's weights' copies (swap.cpp): source 0 is the
// loaded file, 1… the donors in the order added; it lives as long as the
// model, because the weights may point into its buffers.
type Swap struct{ p *C.struct_hydra_swap }

// NewSwap records m's weights as llama.cpp placed them and indexes its file
// (path) as source 0; mmap lets weights in plain host memory be used in
// place from a mapping of their file, as llama.cpp's own load with mmap
// does.
func NewSwap(m Model, path string, mmap bool) (*Swap, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var msg [512]C.char
	p := C.hydra_swap_new(m.p, cs, C.bool(mmap), &msg[0], C.size_t(len(msg)))
	if p == nil {
		return nil, errors.New(C.GoString(&msg[0]))
	}
	return &Swap{p}, nil
}

// AddDonor checks donor (the same model in another quantisation, loaded
// with NoAlloc and the base's placement) against the base and adds its file
// (path) as the next source; the caller frees donor, whose placement the
// swap keeps. The error is the first mismatch.
func (s *Swap) AddDonor(donor Model, path string) error {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var msg [512]C.char
	if C.hydra_swap_add_donor(s.p, donor.p, cs, &msg[0], C.size_t(len(msg))) < 0 {
		return errors.New(C.GoString(&msg[0]))
	}
	return nil
}

// SetPeer names the device (ggml's name, any case) PlacePeer puts weights
// on and returns ggml's own name of it; the context's scheduler must run
// it, or the operations reading those weights could not be placed.
func (s *Swap) SetPeer(c *Context, device string) (string, error) {
	cd := C.CString(device)
	defer C.free(unsafe.Pointer(cd))
	var msg [512]C.char
	if C.hydra_swap_set_peer(s.p, c.p, cd, &msg[0], C.size_t(len(msg))) < 0 {
		return "", errors.New(C.GoString(&msg[0]))
	}
	return C.GoString(C.ggml_backend_dev_name(C.ggml_backend_dev_by_name(cd))), nil
}

// SwapResult is what an Apply did.
type SwapResult struct {
	Swapped, Stayed                     int   // weights re-pointed; of those asked onto the peer, those already there
	Bytes, Allocated, Uploaded, InPlace int64 // their bytes now; allocated, copied and bound in place by this call
	Ops, OpsLocal                       int   // decode-graph operations reading them, and those run where their weight is
	Upload, Reset                       time.Duration
}

// ErrNoWeights is an Apply or UploadBaseline given no weights.
var ErrNoWeights = errors.New("no weights given")

// Apply makes the weights idx names (indices of Weights, ascending) use
// source src's copies at place (Keep: each its own), making the copies it
// lacks (kept for good, so that swapping back and forth allocates nothing
// more), and rebuilds c's graphs, which would otherwise read moved weights'
// old memory. All or nothing: on an error every weight is as it was. Needs c
// idle.
func (s *Swap) Apply(c *Context, idx []int32, src, place int) (SwapResult, error) {
	if len(idx) == 0 {
		return SwapResult{}, ErrNoWeights
	}
	var r C.struct_hydra_swap_result
	var msg [512]C.char
	if C.hydra_swap_apply(s.p, c.p, (*C.int32_t)(unsafe.Pointer(&idx[0])), C.int32_t(len(idx)), C.int(src), C.int(place), &r,
		&msg[0], C.size_t(len(msg))) < 0 {
		return SwapResult{}, errors.New(C.GoString(&msg[0]))
	}
	return SwapResult{Swapped: int(r.swapped), Stayed: int(r.stayed), Bytes: int64(r.bytes), Allocated: int64(r.allocated),
		Uploaded: int64(r.uploaded), InPlace: int64(r.in_place), Ops: int(r.ops), OpsLocal: int(r.ops_local),
		Upload: time.Duration(r.upload_us) * time.Microsecond, Reset: time.Duration(r.reset_us) * time.Microsecond}, nil
}

// Weight is where one weight is now: its source, its place, the device
// holding it ("CPU" for host memory), its bytes, and whether it is in the
// buffer llama.cpp loaded it into.
type Weight struct {
	Name, Device string
	Source       int
	Place        int
	Bytes        int64
	Loaded       bool
}

// Weights lists where every weight is now, in the order Apply's indices
// number them.
func (s *Swap) Weights() []Weight {
	out := make([]Weight, int(C.hydra_swap_count(s.p)))
	for i := range out {
		var name, device *C.char
		var src, place, loaded C.int
		var bytes C.int64_t
		C.hydra_swap_weight(s.p, C.size_t(i), &name, &src, &place, &device, &bytes, &loaded)
		out[i] = Weight{Name: C.GoString(name), Device: C.GoString(device), Source: int(src), Place: int(place),
			Bytes: int64(bytes), Loaded: loaded != 0}
	}
	return out
}

// Layout is a weight's type (ggml's name), its shape (ne, innermost
// first, trailing ones dropped) and the address of its bytes.
type Layout struct {
	Type  string
	Shape []int64
	Data  uintptr
}

// Layout is weight i's layout now.
func (s *Swap) Layout(i int) Layout {
	var typ *C.char
	var ne [4]C.int64_t
	var data C.uintptr_t
	C.hydra_swap_layout(s.p, C.size_t(i), &typ, &ne[0], &data)
	l := Layout{Type: C.GoString(typ), Data: uintptr(data)}
	n := 4
	for n > 1 && ne[n-1] == 1 {
		n--
	}
	for _, v := range ne[:n] {
		l.Shape = append(l.Shape, int64(v))
	}
	return l
}

// Offset is where weight i's bytes are in source src's file.
func (s *Swap) Offset(src, i int) int64 {
	return int64(C.hydra_swap_offset(s.p, C.int(src), C.size_t(i)))
}

// UploadBaseline times a plain copy of source src's bytes of the weights idx
// names into scratch buffers where they live (freed after): what an upload
// is measured against; -1µs for no weights or when memory runs out.
func (s *Swap) UploadBaseline(idx []int32, src int) time.Duration {
	if len(idx) == 0 {
		return -time.Microsecond
	}
	return time.Duration(C.hydra_swap_upload_us(s.p, (*C.int32_t)(unsafe.Pointer(&idx[0])), C.int32_t(len(idx)), C.int(src))) * time.Microsecond
}

// Resident is what the copies take: bytes of buffers allocated, and bytes
// bound in place from mapped files.
func (s *Swap) Resident() (allocated, mapped int64) {
	var a, m C.int64_t
	C.hydra_swap_resident(s.p, &a, &m)
	return int64(a), int64(m)
}
