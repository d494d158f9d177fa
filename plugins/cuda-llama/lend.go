//go:build llama && cgo

package cudallama

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
)

// Combined mode between two engines of one host (host/combined): a peer
// lends its weights by saying where their bytes are; a head binds the
// weights its combined pattern names to them instead of its own copies.
// Host-memory weights that llama.cpp uses in place from a file are lent as
// the file and offset, and the head binds its weights in place over the
// same file, as over a donor file of SWAP_QUANT: both processes read the
// same pages. Weights in device memory are lent by device only: binding
// them across processes (CUDA IPC, docs/design/expert-sharing.md) is not
// built, and a head refuses them with that reason.

// peerKeyPrefix begins the key of a source that is a peer engine's file.
const peerKeyPrefix = "peer:"

func isPeerKey(k string) bool { return strings.HasPrefix(k, peerKeyPrefix) }

// lendNonce tells this process's registries from another's, whose weights
// may sit at the same offsets of other files of the same name.
var lendNonce = func() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

// boundTo is the peer engine's generation bound, "" none.
func (x *swapper) boundTo() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.bound
}

// lendWeights is what this engine lends now: every weight, and for those
// in host memory mapped from a file, the file and offset. The generation
// is a digest of it all, so it changes exactly when a weight does. It is
// read once after each move of the weights, so that a lender's polls do not
// take the context lock from the scheduler's steps.
func (e *engine) lendWeights() (iface.WeightRegistry, error) {
	x := e.swap
	x.mu.Lock()
	lent, moves := x.lent, x.moves
	x.mu.Unlock()
	if lent != nil {
		return *lent, nil
	}
	reg, err := e.readLent()
	if err != nil {
		return reg, err
	}
	x.mu.Lock()
	if x.moves == moves {
		x.lent = &reg
	}
	x.mu.Unlock()
	return reg, nil
}

// readLent reads what lendWeights lends.
func (e *engine) readLent() (iface.WeightRegistry, error) {
	x := e.swap
	maps, err := ownMappings()
	if err != nil {
		return iface.WeightRegistry{}, fmt.Errorf("reading this process's mappings: %w", err)
	}
	e.mu.Lock() // weights move only under it (apply)
	ws := x.sw.Weights()
	reg := iface.WeightRegistry{Arch: x.arch, Weights: make([]iface.LentWeight, len(ws))}
	for i, w := range ws {
		l := x.sw.Layout(i)
		lw := iface.LentWeight{Name: w.Name, Type: l.Type, Shape: l.Shape, Bytes: w.Bytes, Device: w.Device}
		if w.Device == "CPU" {
			if path, off, ok := fileOf(maps, l.Data, w.Bytes); ok {
				lw.File, lw.Offset = path, off
			}
		}
		reg.Weights[i] = lw
	}
	e.mu.Unlock()
	sum := sha256.New()
	fmt.Fprintf(sum, "%s\n", reg.Arch)
	for _, w := range reg.Weights {
		fmt.Fprintf(sum, "%s %s %v %d %s %s %d\n", w.Name, w.Type, w.Shape, w.Bytes, w.Device, w.File, w.Offset)
	}
	reg.Generation = lendNonce + "/" + hex.EncodeToString(sum.Sum(nil))[:16]
	return reg, nil
}

// bindPeer binds the weights the combined pattern names to a peer engine's
// (BindPeer). What cannot be bound is answered solo with the reason; the
// weights stay or go back to this engine's own.
func (e *engine) bindPeer(reg iface.WeightRegistry) iface.ExpertModeResult {
	x := e.swap
	solo := func(why string, args ...any) iface.ExpertModeResult {
		why = fmt.Sprintf(why, args...)
		e.log.Warn("combined mode with the peer engine refused: "+why, "generation", reg.Generation)
		if err := e.unbindPeer(); err != nil {
			why += "; and going back to this engine's own weights failed: " + err.Error()
		}
		return iface.ExpertModeResult{Mode: x.modeNow(), Reason: why}
	}
	if reg.Arch != x.arch {
		return solo("the peer's model is a %q, this engine's a %q", reg.Arch, x.arch)
	}
	idx, err := x.match(x.pattern)
	if err != nil {
		return solo("%s", err)
	}
	lent := make(map[string]iface.LentWeight, len(reg.Weights))
	for _, w := range reg.Weights {
		lent[w.Name] = w
	}
	byFile := map[string][]int32{}
	for _, i := range idx {
		name := x.names[i]
		w, ok := lent[name]
		if !ok {
			return solo("the peer lends no weight %s", name)
		}
		if own := x.sw.Layout(int(i)).Shape; !slices.Equal(own, w.Shape) {
			return solo("%s: shape %v on the peer, %v here", name, w.Shape, own)
		}
		if w.File == "" {
			return solo("the peer's %s is in %s memory, not in a file this engine can map: binding a peer's device memory (CUDA IPC) is not built", name, w.Device)
		}
		byFile[w.File] = append(byFile[w.File], i)
	}
	// The files as sources, checked as donors are: the same architecture,
	// names and shapes, each weight where the peer says it is.
	srcs := map[string]int{}
	for _, path := range slices.Sorted(maps.Keys(byFile)) {
		src, err := e.peerSource(path)
		if err != nil {
			return solo("the peer's file %s: %s", path, err)
		}
		for _, i := range byFile[path] {
			if off := x.sw.Offset(src, int(i)); off != lent[x.names[i]].Offset {
				return solo("%s is at offset %d of %s, the peer says %d: the file changed since the peer mapped it", x.names[i], off, path, lent[x.names[i]].Offset)
			}
		}
		srcs[path] = src
	}
	start := time.Now()
	bound, err := e.bindSources(byFile, srcs, reg.Generation)
	if err != nil {
		return solo("%s", err)
	}
	e.log.Info("combined mode: bound to the peer engine's weights", "generation", reg.Generation, "weights", bound,
		"files", len(byFile), "took", time.Since(start).String())
	return iface.ExpertModeResult{Mode: "combined", Bound: bound}
}

// bindSources points each file's weights at that file, between two of the
// scheduler's steps (busy slots decode on, with the peer's weights from
// their next step), and records the generation bound. All or nothing: a
// file that fails puts the weights of the files bound before it back on
// this engine's own (each apply is itself all or nothing).
func (e *engine) bindSources(byFile map[string][]int32, srcs map[string]int, gen string) (int, error) {
	x := e.swap
	e.mu.Lock()
	defer e.mu.Unlock()
	var done []int32
	for path, ids := range byFile {
		clearLlamaError()
		if _, err := x.sw.Apply(e.ctx.binding(), ids, srcs[path], placeHome); err != nil {
			err = fmt.Errorf("binding to %s: %s%s", path, err, lastLlamaError())
			if len(done) > 0 && x.boundTo() == "" {
				slices.Sort(done)
				clearLlamaError()
				if _, uerr := x.sw.Apply(e.ctx.binding(), done, 0, placeHome); uerr != nil {
					err = fmt.Errorf("%w; and putting back the weights bound before it: %s%s", err, uerr, lastLlamaError())
				}
				x.refresh()
			}
			return 0, err
		}
		done = append(done, ids...)
	}
	x.mu.Lock()
	x.bound = gen
	x.mu.Unlock()
	x.refresh()
	return len(done), nil
}

// unbindPeer puts the pattern's weights back on this engine's own copies.
func (e *engine) unbindPeer() error {
	x := e.swap
	if x.boundTo() == "" {
		return nil
	}
	idx, err := x.match(x.pattern)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	clearLlamaError()
	if _, err := x.sw.Apply(e.ctx.binding(), idx, 0, placeHome); err != nil {
		return fmt.Errorf("%s%s", err, lastLlamaError())
	}
	x.mu.Lock()
	x.bound = ""
	x.mu.Unlock()
	x.refresh()
	e.log.Info("combined mode off: the weights are this engine's own again")
	return nil
}

// peerSource is the source index of a peer engine's file, added as a donor
// on first use (kept: binding again after the peer's swap or restart finds
// it) with an identity of its path, size and time. The donor's metadata is
// read before the context lock is taken; the sources grow under it, as
// applies and swaps read them there, and under the swapper's lock, as Info
// reads the keys there.
func (e *engine) peerSource(path string) (int, error) {
	x := e.swap
	key := peerKeyPrefix + path
	if src := x.source(key); src >= 0 {
		return src, nil
	}
	st, err := os.Stat(path)
	if err != nil {
		return -1, err
	}
	donor, err := loadDonor(path, x.nGPU, x.placement)
	if err != nil {
		return -1, err
	}
	defer donor.Free()
	sum := sha256.Sum256(fmt.Appendf(nil, "hydra peer file\n%s\n%d\n%d\n", path, st.Size(), st.ModTime().UnixNano()))
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := x.takeDonor(donor, path); err != nil {
		return -1, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.keys = append(x.keys, key)
	x.ids = append(x.ids, iface.ModelIdentity{Hash: hex.EncodeToString(sum[:]), Alias: x.ids[0].Alias})
	return len(x.keys) - 1, nil
}
