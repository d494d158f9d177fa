//go:build llama && cgo

package cudallama

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// SWAP_QUANT (and, through the same machinery, combined mode: combined.go):
// a weight of the loaded model can be re-pointed to a copy of itself from
// another quantisation of the same model, a donor file (quant.KEY=PATH), on
// the device where llama.cpp placed it (swap.cpp). Donors are checked at
// Load; their bytes are read when a swap first needs them, into buffers kept
// for good, so swapping back and forth allocates nothing more.

// swapper is a loaded model's weights' copies: the sources (the loaded file
// and the donors), the peer device of combined mode, and what the weights
// use now.
type swapper struct {
	sw    *llama.Swap
	keys  []string // the sources' keys: llamaopt.QuantBase, then the donors' in sorted order
	names []string // the weights' names, as hydra_swap_weight numbers them: patterns are matched here, in Go
	log   hclog.Logger

	combined combinedConfig
	pattern  string // the weights combined mode places on the peer or binds to a peer engine's
	arch     string // the model's architecture, which a peer engine's must be

	// To add a peer engine's file as a source (lend.go) as a donor is.
	nGPU      int
	placement llamaopt.PlacementOptions

	hashes func() ([]iface.ModelIdentity, error) // the donors' identities, hashed while Load finishes
	ids    []iface.ModelIdentity                 // the sources' identities, once hashed

	mu sync.Mutex // guards the fields below, read by Info at any time
	state
}

// state is what the weights use now, as Info reports it.
type state struct {
	active   string // ActiveQuant: the keys whose weights are in use, joined by "+"
	identity iface.ModelIdentity
	mode     string // "solo" or "combined"
	bound    string // the peer engine's generation the pattern's weights are bound to (lend.go); "" none
	moves    int    // applies so far: what is lent is read again after one
	lent     *iface.WeightRegistry
	last     applied // the last apply's figures
}

// newSwapper indexes the loaded model's weights, checks the donors against
// them and starts hashing their files.
func newSwapper(ctx context.Context, mdl *model, lc *lctx, path string, opts llamaopt.Options, nGPU int, log hclog.Logger) (*swapper, error) {
	sw, err := llama.NewSwap(mdl.m, path, opts.Mmap)
	if err != nil {
		return nil, fmt.Errorf("%w: indexing the model's weights: %s", iface.ErrBadRequest, err)
	}
	x := &swapper{sw: sw, keys: []string{llamaopt.QuantBase}, log: log, nGPU: nGPU, placement: opts.PlacementOptions,
		pattern: cmp.Or(opts.CombinedOptions.Pattern, llamaopt.DefaultCombinedPattern), arch: mdl.metaString("general.architecture")}
	for _, w := range x.weights() {
		x.names = append(x.names, w.name)
	}
	var paths []string
	for _, k := range slices.Sorted(maps.Keys(opts.Quants)) {
		p, err := regularFile(opts.Quants[k])
		if err == nil {
			err = x.addDonor(p, nGPU, opts.PlacementOptions)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: option %s%s: %w", iface.ErrBadRequest, llamaopt.OptQuantPrefix, k, err)
		}
		x.keys, paths = append(x.keys, k), append(paths, p)
	}
	if err := x.setCombined(lc, opts.CombinedOptions); err != nil {
		return nil, err
	}
	x.hashes = hashSources(ctx, paths, opts.Alias)
	x.mode = "solo"
	return x, nil
}

// addDonor loads a donor's metadata as llama.cpp places the loaded model's
// weights (the same GPU layers and placement rules, nothing allocated:
// no_alloc, which needs mmap off) and checks it against them. The donor
// model is freed: the swapper keeps where each weight goes and its file.
func (x *swapper) addDonor(path string, nGPU int, p llamaopt.PlacementOptions) error {
	donor, err := loadDonor(path, nGPU, p)
	if err != nil {
		return err
	}
	defer donor.Free()
	return x.takeDonor(donor, path)
}

// loadDonor loads a donor's metadata, nothing allocated.
func loadDonor(path string, nGPU int, p llamaopt.PlacementOptions) (llama.Model, error) {
	clearLlamaError()
	donor, err := loadWeights(path, llama.ModelParams{GPULayers: nGPU, NoAlloc: true}, p)
	if errors.Is(err, llama.ErrLoad) {
		return llama.Model{}, fmt.Errorf("llama.cpp could not read %s%s", path, lastLlamaError())
	}
	return donor, err
}

// takeDonor checks a loaded donor against the model and adds its file as
// the next source.
func (x *swapper) takeDonor(donor llama.Model, path string) error {
	if err := x.sw.AddDonor(donor, path); err != nil {
		return fmt.Errorf("not the loaded model in another quantisation: %s", err)
	}
	return nil
}

// hashSources hashes the donor files, each in a goroutine, while Load goes
// on; the function returned waits for their identities (the loaded
// model's is Load's).
func hashSources(ctx context.Context, paths []string, alias string) func() ([]iface.ModelIdentity, error) {
	waits := make([]func() (iface.ModelIdentity, error), len(paths))
	for i, p := range paths {
		waits[i] = hashModel(ctx, p, alias)
	}
	return sync.OnceValues(func() ([]iface.ModelIdentity, error) {
		out := make([]iface.ModelIdentity, len(paths))
		for i, w := range waits {
			id, err := w()
			if err != nil {
				return nil, err
			}
			out[i] = id
		}
		return out, nil
	})
}

// describe waits for the donors' identities; base is the loaded model's.
func (x *swapper) describe(base iface.ModelIdentity) error {
	donors, err := x.hashes()
	if err != nil {
		return err
	}
	x.ids = append([]iface.ModelIdentity{base}, donors...)
	x.refresh()
	return nil
}

// info is base with what the weights use now.
func (x *swapper) info(base iface.BackendInfo) iface.BackendInfo {
	x.mu.Lock()
	defer x.mu.Unlock()
	quants := x.quantKeys()
	if len(quants) > 1 {
		base.Quants = quants
	}
	if len(quants) > 1 || x.bound != "" { // weights from a peer's file make another model
		base.ActiveQuant = x.active
		base.Model = x.identity
	}
	base.ExpertMode = x.mode
	base.PeerDevice, base.PeerReachable = x.combined.device, x.combined.reachable
	return base
}

// quantKeys are the sources SWAP_QUANT may name: the keys but the peer
// engines' files (lend.go).
func (x *swapper) quantKeys() []string {
	return slices.DeleteFunc(slices.Clone(x.keys), isPeerKey)
}

// source is the index of a quantisation key, -1 if unknown.
func (x *swapper) source(key string) int { return slices.Index(x.keys, key) }

// match is the indices of the weights pattern matches; a pattern that does
// not compile or matches no weight is refused.
func (x *swapper) match(pattern string) ([]int32, error) {
	hit, err := matchWeights(pattern, x.names)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: tensor pattern %w", iface.ErrBadRequest, err)
	case len(hit) == 0:
		return nil, fmt.Errorf("%w: the tensor pattern %q matches none of the model's weights", iface.ErrBadRequest, truncate(pattern, 200))
	}
	idx := make([]int32, len(hit))
	for i, h := range hit {
		idx[i] = int32(h)
	}
	return idx, nil
}

// check refuses a pattern that does not compile or matches no weight.
func (x *swapper) check(pattern string) error {
	_, err := x.match(pattern)
	return err
}

// Places of a weight's copy (llama.Swap).
const (
	placeHome = llama.PlaceHome
	placePeer = llama.PlacePeer
	keep      = llama.Keep
)

// applied is what an apply did (llama.SwapResult).
type applied struct {
	swapped, stayed                     int
	bytes, allocated, uploaded, inPlace int64
	ops, opsLocal                       int // decode-graph operations reading the weights, and those run where their weight is
	upload, reset                       time.Duration
}

// apply makes the weights matching pattern use source src's copies at
// place (keep: each its own), all or nothing, and updates the state. Needs
// the engine quiesced.
func (x *swapper) apply(c *llama.Context, pattern string, src, place int) (applied, error) {
	idx, err := x.match(pattern)
	if err != nil {
		return applied{}, err
	}
	clearLlamaError()
	r, err := x.sw.Apply(c, idx, src, place)
	if err != nil {
		return applied{}, fmt.Errorf("%s%s", err, lastLlamaError())
	}
	a := applied{swapped: r.Swapped, stayed: r.Stayed, bytes: r.Bytes, allocated: r.Allocated, uploaded: r.Uploaded,
		inPlace: r.InPlace, ops: r.Ops, opsLocal: r.OpsLocal, upload: r.Upload, reset: r.Reset}
	x.refresh()
	x.mu.Lock()
	x.last = a
	x.mu.Unlock()
	return a, nil
}

// refresh reads what every weight uses now: ActiveQuant is the keys in use,
// base first; the identity is a donor's own when every weight comes from
// it (the same model as that file, bit for bit), the loaded model's when
// none does, and otherwise a hash of the loaded model's and of which weight
// comes from which file, so two engines report the same identity exactly
// when their weights are the same.
func (x *swapper) refresh() {
	ids := x.ids
	used := make([]bool, len(x.keys))
	peer := false
	mix := sha256.New()
	fmt.Fprintf(mix, "hydra quantisation mix\n%s\n", ids[0].Hash)
	for _, w := range x.weights() {
		src := x.source(w.key)
		used[src] = true
		peer = peer || w.peer
		if src != 0 {
			fmt.Fprintf(mix, "%s %s\n", w.name, ids[src].Hash)
		}
	}
	var active []string
	for k, u := range used {
		if u {
			active = append(active, x.keys[k])
		}
	}
	id := ids[0]
	switch {
	case len(active) == 1:
		id = ids[x.source(active[0])]
		id.Alias = ids[0].Alias
	default:
		id.Hash = hex.EncodeToString(mix.Sum(nil))
	}
	x.mu.Lock()
	x.moves++
	x.lent = nil
	x.active, x.identity = strings.Join(active, "+"), id
	x.mode = map[bool]string{false: "solo", true: "combined"}[peer || x.bound != ""]
	x.mu.Unlock()
}

// resident is what the copies take: bytes allocated in buffers, bytes bound
// in place from mapped files.
func (x *swapper) resident() (allocated, mapped int64) { return x.sw.Resident() }

// weightPlace is where one weight is now: the quantisation it comes from,
// the device holding it, on the peer or not, its bytes, and whether it is
// in the buffer llama.cpp loaded it into.
type weightPlace struct {
	name, key, device string
	peer, loaded      bool
	bytes             int64
}

// weights lists where every weight is now.
func (x *swapper) weights() []weightPlace {
	ws := x.sw.Weights()
	out := make([]weightPlace, len(ws))
	for i, w := range ws {
		out[i] = weightPlace{name: w.Name, key: x.keys[w.Source], device: w.Device, peer: w.Place == placePeer,
			loaded: w.Loaded, bytes: w.Bytes}
	}
	return out
}

// uploadBaseline times a plain copy of key's bytes of the weights matching
// pattern into scratch buffers where those weights live: what a first swap's
// upload is compared with.
func (x *swapper) uploadBaseline(pattern, key string) time.Duration {
	idx, err := x.match(pattern)
	if err != nil {
		return -time.Microsecond // as hydra_swap_upload_us answers a pattern matching nothing
	}
	return x.sw.UploadBaseline(idx, x.source(key))
}

// quiesce holds every slot and the context, so that nothing runs while
// weights move; ErrBusy naming a slot at work otherwise. The function
// returned lets them go.
func (e *engine) quiesce() (func(), error) {
	for i, s := range e.cells.Slots {
		if err := s.Acquire(i); err != nil {
			for _, held := range e.cells.Slots[:i] {
				held.Release()
			}
			return nil, fmt.Errorf("%w: slot %d is at work, and weights move only while every slot is idle", iface.ErrBusy, i)
		}
	}
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		for _, s := range e.cells.Slots {
			s.Release()
		}
	}, nil
}

// swapQuant is SwapQuant on a loaded engine: the weights matching pattern
// come from key's file from now on, on the device they are on. The slots
// keep their sequences and KV; their next-token logits, computed with the
// old weights, are dropped, so each slot's next decode evaluates its last
// token again with the new ones.
func (e *engine) swapQuant(key, pattern string) (iface.SwapResult, error) {
	x := e.swap
	if x == nil || len(x.quantKeys()) == 1 {
		return iface.SwapResult{}, fmt.Errorf("%w: no quantisation to swap to: configure %sKEY=PATH", iface.ErrNotImplemented, llamaopt.OptQuantPrefix)
	}
	src := x.source(key)
	if src < 0 || isPeerKey(key) {
		return iface.SwapResult{}, fmt.Errorf("%w: unknown quantisation key %q (known: %s)", iface.ErrBadRequest, key, strings.Join(x.quantKeys(), ", "))
	}
	if err := x.check(pattern); err != nil {
		return iface.SwapResult{}, err
	}
	if x.boundTo() != "" {
		return iface.SwapResult{}, fmt.Errorf("%w: combined mode is bound to a peer engine's weights: SET_EXPERT_MODE solo first, or swap on the peer", iface.ErrBusy)
	}
	start := time.Now()
	release, err := e.quiesce()
	if err != nil {
		return iface.SwapResult{}, err
	}
	defer release()
	res, err := x.apply(e.ctx.binding(), pattern, src, keep)
	if err != nil {
		return iface.SwapResult{}, fmt.Errorf("swapping to %s: %s (nothing changed)", key, err)
	}
	for _, s := range e.cells.Slots {
		s.SetLogits(nil)
	}
	took := time.Since(start)
	e.logApplied("quantisation swapped", res, took, "quant_key", key, "tensor_pattern", pattern)
	return iface.SwapResult{Swapped: res.swapped, Bytes: res.bytes, Duration: took, KVPreserved: true}, nil
}

// logApplied logs what an apply did and what the copies now take.
func (e *engine) logApplied(msg string, a applied, took time.Duration, kv ...any) {
	allocated, mapped := e.swap.resident()
	info := e.infoNow()
	e.log.Info(msg, append(kv, "weights", a.swapped, "bytes", a.bytes, "allocated", a.allocated, "uploaded", a.uploaded,
		"in_place", a.inPlace, "stayed_home", a.stayed, "upload", a.upload.String(), "graph_reset", a.reset.String(),
		"ops", a.ops, "ops_where_their_weights_are", a.opsLocal, "copies_allocated", allocated, "copies_mapped", mapped,
		"active_quant", info.ActiveQuant, "mode", info.ExpertMode, "model_hash", info.Model.Hash, "took", took.String())...)
}

// describeSwaps completes the loaded engine's info: where its layers are,
// and with a swapper the quantisations, once the donors are hashed.
func (e *engine) describeSwaps() error {
	e.info.LayerSplit, e.info.SplitMode = layerSplit(e.model)
	e.info.ExpertMode = "solo"
	if e.swap == nil {
		return nil
	}
	if err := e.swap.describe(e.info.Model); err != nil {
		return err
	}
	e.info = e.swap.info(e.info) // what Load returns, the host's until it asks again
	return nil
}

// infoNow is the engine's info as it is now: the loaded model's, with what
// the weights use.
func (e *engine) infoNow() iface.BackendInfo {
	if e.swap == nil {
		return e.info
	}
	return e.swap.info(e.info)
}
