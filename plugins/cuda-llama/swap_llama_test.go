//go:build llama && cgo

package cudallama

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// SWAP_QUANT and combined mode on real llama.cpp (CPU here): the tests'
// MoE model (gguf.TinyMoE) written at F16, Q8_0 and Q4_0 from one seed is
// the same model at three quantisations, and gguf's overrides build the
// oracle of every partial swap: a file whose matched weights are those of
// the other quantisation, bit for bit. A swap must compute exactly what
// llama.cpp computes loading the oracle.

// expertWeights are the routed experts of every layer.
const expertWeights = `blk\.[0-9]+\.ffn_(gate|up|down)_exps\.weight`

// swapModel writes TinyMoE with its big matrices in w, those matching
// pattern (if any) in other.
func swapModel(t testing.TB, w gguf.WeightType, pattern string, other gguf.WeightType) string {
	t.Helper()
	c := gguf.TinyMoE()
	c.Type = w
	name := "swap-" + w.String()
	if pattern != "" {
		c.Overrides = []gguf.TypeOverride{{Pattern: regexp.MustCompile(pattern), Type: other}}
		name += "-experts-" + other.String()
	}
	return modelFile(t, name, c)
}

// swapOptions are the quantisations every swap test configures.
func swapOptions(t testing.TB) map[string]string {
	return map[string]string{
		llamaopt.OptQuantPrefix + "q8": swapModel(t, gguf.WeightQ8_0, "", 0),
		llamaopt.OptQuantPrefix + "q4": swapModel(t, gguf.WeightQ4_0, "", 0),
		llamaopt.OptNCtx:               "512",
	}
}

// computed is what a model computes for the tests' prompt: the prefill's
// logits and the greedy tokens after.
type computed struct {
	logits []float32
	tokens []int32
}

func compute(t *testing.T, b *Backend) computed {
	t.Helper()
	if err := b.ClearSlot(context.Background(), 0); err != nil { // no cached prefix: every position evaluated now
		t.Fatal(err)
	}
	res := prefill(t, b, 0, "the weights of this model came from a file")
	toks, _ := decode(t, b, 0, 16, iface.SamplerParams{})
	return computed{logits: res.Logits, tokens: toks}
}

// same reports whether two computations agree bit for bit.
func same(a, b computed) bool {
	return slices.Equal(a.tokens, b.tokens) && slices.EqualFunc(a.logits, b.logits, func(x, y float32) bool {
		return math.Float32bits(x) == math.Float32bits(y)
	})
}

func fileHash(t *testing.T, path string) string {
	t.Helper()
	id, err := iface.FileIdentity(context.Background(), path, "")
	if err != nil {
		t.Fatal(err)
	}
	return id.Hash
}

func info(t testing.TB, b *Backend) iface.BackendInfo {
	t.Helper()
	i, err := b.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// TestSwapQuantMatchesOracles swaps the F16 model's weights, all or the
// experts, to Q8_0 and Q4_0 and back; after each swap the model computes
// what its oracle computes, bit for bit, and reports the identity of what
// it now is.
func TestSwapQuantMatchesOracles(t *testing.T) {
	f16 := swapModel(t, gguf.WeightF16, "", 0)
	b := load(t, f16, 1, swapOptions(t))
	n := len(b.eng.Load().swap.weights())
	before := info(t, b)
	if !slices.Equal(before.Quants, []string{"base", "q4", "q8"}) || before.ActiveQuant != "base" || before.Model.Hash != fileHash(t, f16) {
		t.Fatalf("after Load: quants %v, active %q, hash %s", before.Quants, before.ActiveQuant, before.Model.Hash)
	}
	start := compute(t, b)
	mixes := map[string]string{} // oracle → identity hash: the same weights reached twice give the same identity
	for _, tc := range []struct {
		key, pattern string
		swapped      int
		oracle       string
		active       string
		hash         string // "" a mix: neither file's
	}{
		{"q8", ".*", n, swapModel(t, gguf.WeightQ8_0, "", 0), "q8", fileHash(t, swapModel(t, gguf.WeightQ8_0, "", 0))},
		{"base", ".*", n, f16, "base", before.Model.Hash},
		{"q8", expertWeights, 12, swapModel(t, gguf.WeightF16, expertWeights, gguf.WeightQ8_0), "base+q8", ""},
		{"q4", expertWeights, 12, swapModel(t, gguf.WeightF16, expertWeights, gguf.WeightQ4_0), "base+q4", ""},
		{"q4", ".*", n, swapModel(t, gguf.WeightQ4_0, "", 0), "q4", fileHash(t, swapModel(t, gguf.WeightQ4_0, "", 0))},
		{"base", expertWeights, 12, swapModel(t, gguf.WeightQ4_0, expertWeights, gguf.WeightF16), "base+q4", ""},
		{"q8", `blk\.1\.ffn_up_exps`, 1, "", "base+q4+q8", ""},
		{"base", ".*", n, f16, "base", before.Model.Hash},
		{"q8", expertWeights, 12, swapModel(t, gguf.WeightF16, expertWeights, gguf.WeightQ8_0), "base+q8", ""},
	} {
		res, err := b.SwapQuant(context.Background(), tc.key, tc.pattern)
		if err != nil {
			t.Fatalf("swap %s %s: %v", tc.key, tc.pattern, err)
		}
		got := info(t, b)
		if res.Swapped != tc.swapped || res.Bytes <= 0 || !res.KVPreserved || got.ActiveQuant != tc.active {
			t.Errorf("swap %s %s: %+v, active %q", tc.key, tc.pattern, res, got.ActiveQuant)
		}
		switch h, seen := mixes[tc.oracle]; {
		case tc.hash != "" && got.Model.Hash != tc.hash:
			t.Errorf("swap %s %s: identity %s, want the file's %s", tc.key, tc.pattern, got.Model.Hash, tc.hash)
		case tc.hash == "" && (got.Model.Hash == before.Model.Hash || seen && h != got.Model.Hash):
			t.Errorf("swap %s %s: identity %s for a mix (the same weights earlier: %q)", tc.key, tc.pattern, got.Model.Hash, h)
		}
		if tc.oracle != "" {
			mixes[tc.oracle] = got.Model.Hash
		}
		if got.Model.Alias != before.Model.Alias {
			t.Errorf("swap %s %s: alias %q, was %q", tc.key, tc.pattern, got.Model.Alias, before.Model.Alias)
		}
		if tc.oracle == "" {
			continue
		}
		want, have := compute(t, load(t, tc.oracle, 1, map[string]string{llamaopt.OptNCtx: "512"})), compute(t, b)
		if !same(have, want) {
			t.Errorf("swap %s %s: tokens %v, the oracle's %v (logits equal: %v)", tc.key, tc.pattern, have.tokens, want.tokens,
				same(computed{logits: have.logits}, computed{logits: want.logits}))
		}
		if tc.oracle != f16 && same(computed{logits: want.logits}, computed{logits: start.logits}) {
			t.Errorf("swap %s %s: the oracle computes what the F16 model does: the comparison proves nothing", tc.key, tc.pattern)
		}
	}
}

// TestSwapQuantKeepsState: a swap leaves every slot's sequence and KV as
// they were (the state streams the same bytes before, after and back), and
// the slots decode on with the new weights, their first token included.
func TestSwapQuantKeepsState(t *testing.T) {
	b := load(t, swapModel(t, gguf.WeightF16, "", 0), 2, swapOptions(t))
	prefill(t, b, 0, story)
	decode(t, b, 0, 5, iface.SamplerParams{})
	prefill(t, b, 1, "a second sequence in the same cache")
	states := func() [2][]byte { return [2][]byte{stateOf(t, b, 0, 64<<10), stateOf(t, b, 1, 1<<20)} }
	before, si := states(), slotInfo(t, b, 0)
	for _, key := range []string{"q8", "q4", "base"} {
		if _, err := b.SwapQuant(context.Background(), key, ".*"); err != nil {
			t.Fatal(err)
		}
		if got := states(); !bytes.Equal(got[0], before[0]) || !bytes.Equal(got[1], before[1]) {
			t.Fatalf("after the swap to %s the slots' states differ", key)
		}
		if got := slotInfo(t, b, 0); got.NPast != si.NPast || !slices.Equal(got.Tokens, si.Tokens) || got.StateSize != si.StateSize {
			t.Fatalf("after the swap to %s slot 0 is %+v, was %+v", key, got, si)
		}
		if l := b.eng.Load().cells.Slots[0].Logits(); l != nil {
			t.Fatalf("after the swap to %s slot 0 kept the old weights' logits", key)
		}
	}

	// Decoding after a swap equals decoding the same state restored into
	// the other quantisation: its first token is computed with the new
	// weights too.
	q8 := load(t, swapModel(t, gguf.WeightQ8_0, "", 0), 1, map[string]string{llamaopt.OptNCtx: "512"})
	if _, err := q8.StatePut(context.Background(), 0, si.Tokens, bytes.NewReader(before[0]), int64(len(before[0]))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SwapQuant(context.Background(), "q8", ".*"); err != nil {
		t.Fatal(err)
	}
	want, _ := decode(t, q8, 0, 12, iface.SamplerParams{})
	if got, _ := decode(t, b, 0, 12, iface.SamplerParams{}); !slices.Equal(got, want) {
		t.Fatalf("decoded %v after the swap, the Q8_0 model %v from the same state", got, want)
	}
}

// TestSwapQuantBusy: a swap waits for no one: while a slot decodes,
// SWAP_QUANT is refused as busy and succeeds once the slot is idle; a mode
// change is made meanwhile, between two steps (TestCombinedWhileDecoding).
func TestSwapQuantBusy(t *testing.T) {
	opts := swapOptions(t)
	opts[llamaopt.OptCombinedPeer] = "CPU"
	b := load(t, swapModel(t, gguf.WeightF16, "", 0), 2, opts)
	prefill(t, b, 1, story)
	hold, emitted := make(chan struct{}), make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 1, NPredict: 4}, func(iface.Token) error {
			select {
			case emitted <- struct{}{}:
			default:
			}
			<-hold
			return nil
		})
		done <- err
	}()
	<-emitted
	before := info(t, b)
	if _, err := b.SwapQuant(context.Background(), "q8", ".*"); !errors.Is(err, iface.ErrBusy) || !strings.Contains(err.Error(), "slot 1") {
		t.Errorf("swap while slot 1 decodes: %v", err)
	}
	for _, want := range []string{"combined", "solo"} {
		if mode, err := b.SetExpertMode(context.Background(), want); err != nil || mode != want {
			t.Errorf("%s while slot 1 decodes: %q, %v", want, mode, err)
		}
	}
	if got := info(t, b); got.ActiveQuant != before.ActiveQuant || got.Model != before.Model || got.ExpertMode != "solo" {
		t.Errorf("a refused swap changed the info: %+v", got)
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := b.SwapQuant(context.Background(), "q8", ".*"); err != nil {
		t.Fatalf("swap once idle: %v", err)
	}
	if mode, err := b.SetExpertMode(context.Background(), "combined"); err != nil || mode != "combined" {
		t.Fatalf("combined once idle: %q, %v", mode, err)
	}
}

// TestSwapQuantErrors: an unknown key, a pattern that does not compile or
// matches nothing are refused as bad requests and change nothing; without
// quantisations SWAP_QUANT is not implemented.
func TestSwapQuantErrors(t *testing.T) {
	b := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, swapOptions(t))
	if _, err := b.SwapQuant(context.Background(), "q8", expertWeights); err != nil {
		t.Fatal(err)
	}
	before, weights := info(t, b), b.eng.Load().swap.weights()
	for _, tc := range []struct{ key, pattern, want string }{
		{"q6_k", ".*", `unknown quantisation key "q6_k" (known: base, q4, q8)`},
		{"Q8", ".*", "unknown quantisation key"},
		{"q4", `blk\.9\.`, "matches none of the model's weights"},
		{"q4", `blk\.(`, "is not a regular expression"},
	} {
		_, err := b.SwapQuant(context.Background(), tc.key, tc.pattern)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SwapQuant(%q, %q): %v, want %q", tc.key, tc.pattern, err, tc.want)
		}
	}
	if got := info(t, b); !slices.Equal(got.Quants, before.Quants) || got.ActiveQuant != before.ActiveQuant || got.Model != before.Model {
		t.Errorf("refused swaps changed the info: %+v", got)
	}
	if !slices.Equal(b.eng.Load().swap.weights(), weights) {
		t.Error("refused swaps moved weights")
	}

	plain := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, nil)
	if _, err := plain.SwapQuant(context.Background(), "q8", ".*"); !errors.Is(err, iface.ErrNotImplemented) {
		t.Errorf("SwapQuant without quantisations: %v", err)
	}
	if i := info(t, plain); len(i.Quants) != 0 || i.ExpertMode != "solo" || i.PeerDevice != "" || !strings.HasPrefix(i.LayerSplit, "0-") || i.SplitMode != "layer" {
		t.Errorf("info without quantisations or peer: %+v", i)
	}
}

// TestSwapQuantLoadChecks: Load refuses a donor that is not the model in
// another quantisation, naming the first difference, and bad quant options.
func TestSwapQuantLoadChecks(t *testing.T) {
	wider := gguf.TinyMoE()
	wider.ExpertFF = 64
	fewer := gguf.TinyMoE()
	fewer.Layers = 3
	dir := t.TempDir()
	for _, tc := range []struct {
		name, key, path, want string
	}{
		{"experts of another width", "wide", modelFile(t, "swap-wider", wider),
			"blk.0.ffn_gate_exps.weight is [64, 64, 4, 1], the model's [64, 32, 4, 1]"},
		{"another layer count", "short", modelFile(t, "swap-fewer", fewer), "weights, the model"},
		{"another architecture", "dense", tiny(t), "is a llama model, the model a qwen3moe one"},
		{"a missing file", "gone", dir + "/missing.gguf", "no such file"},
		{"not a model", "junk", writeFile(t, dir+"/junk.gguf", "not a model"), "llama.cpp could not read"},
		{"the reserved key", "base", tiny(t), `"base" names the loaded model itself`},
		{"an empty key", "", tiny(t), "must not be empty"},
		{"a key with a plus", "a+b", tiny(t), "no '+'"},
	} {
		b := New(testLogger())
		_, err := b.Load(context.Background(), iface.LoadRequest{Model: swapModel(t, gguf.WeightF16, "", 0), NSlots: 1,
			Options: map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "512", llamaopt.OptQuantPrefix + tc.key: tc.path}})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Load: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// rss is the process's resident anonymous and file-backed memory (bytes).
func rss(t testing.TB) (anon, file int64) {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc/self/status")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "RssAnon":
			anon = kb << 10
		case "RssFile":
			file = kb << 10
		}
	}
	return anon, file
}

// memoryModel is TinyMoE, or with HYDRA_TEST_SWAP_MB a model of about that
// many MiB at F16 (for the README's figures).
func memoryModel(t testing.TB, w gguf.WeightType) string {
	c := gguf.TinyMoE()
	name := "swap-mem-" + w.String()
	if mb, _ := strconv.Atoi(os.Getenv("HYDRA_TEST_SWAP_MB")); mb > 0 {
		c.Embd, c.Heads, c.KVHeads, c.ExpertFF, c.Experts, c.ExpertsUsed = 512, 8, 2, 512, 16, 2
		c.Layers = max(1, mb<<20/(2*(3*c.Embd*c.ExpertFF*c.Experts+4*c.Embd*c.Embd)))
		name += fmt.Sprintf("-%dmb", mb)
	}
	c.Type = w
	return modelFile(t, name, c)
}

// TestSwapQuantMemory: the copies a swap makes are made once and kept, so
// swapping back and forth allocates nothing more; with use_mmap, copies in
// host memory are bound where the donor file is mapped and allocate
// nothing at all. It logs what stays resident.
func TestSwapQuantMemory(t *testing.T) {
	for _, mmap := range []bool{false, true} {
		t.Run(fmt.Sprintf("use_mmap=%v", mmap), func(t *testing.T) {
			plain := map[string]string{llamaopt.OptNCtx: "512", llamaopt.OptMmap: strconv.FormatBool(mmap)}
			anonP, fileP := rss(t)
			load(t, memoryModel(t, gguf.WeightF16), 1, plain)
			anon0, file0 := rss(t)
			opts := maps.Clone(plain)
			opts[llamaopt.OptQuantPrefix+"q8"] = memoryModel(t, gguf.WeightQ8_0)
			b := load(t, memoryModel(t, gguf.WeightF16), 1, opts)
			anon1, file1 := rss(t)
			x := b.eng.Load().swap
			var rounds []int64
			var took []time.Duration
			for range 20 {
				for _, key := range []string{"q8", "base"} {
					res, err := b.SwapQuant(context.Background(), key, ".*")
					if err != nil {
						t.Fatal(err)
					}
					took = append(took, res.Duration)
				}
				allocated, _ := x.resident()
				rounds = append(rounds, allocated)
			}
			anon2, file2 := rss(t)
			allocated, mapped := x.resident()
			if slices.Max(rounds) != rounds[0] {
				t.Fatalf("copies allocated per round: %v", rounds)
			}
			// On a GPU the copies of the weights it holds are device memory,
			// allocated whether or not the donor is mapped.
			gpu := onGPU(b)
			if !mmap && (allocated == 0 || mapped != 0) || mmap && !gpu && allocated != 0 || mmap && gpu && allocated == 0 {
				t.Fatalf("use_mmap=%v, on a GPU %v: %d bytes allocated, %d mapped", mmap, gpu, allocated, mapped)
			}
			if grew := anon2 - anon1 - allocated; grew > 8<<20 {
				t.Errorf("40 swaps grew anonymous memory by %d bytes beyond the %d of the copies", grew, allocated)
			}
			t.Logf("load without a donor: RssAnon +%s, RssFile +%s; with one: RssAnon +%s, RssFile +%s; after 40 swaps: RssAnon +%s, RssFile +%s; copies: %s allocated, %s bound in place; swaps %v (first) %v (last)",
				mib(anon0-anonP), mib(file0-fileP), mib(anon1-anon0), mib(file1-file0), mib(anon2-anon1), mib(file2-file1),
				mib(allocated), mib(mapped), took[0], took[len(took)-1])
		})
	}
}

// combinedTest loads the F16 model with the peer device: CUDA1 where there
// are two GPUs, else the CPU standing in for it.
func combinedTest(t *testing.T, nSlots int, extra map[string]string) (*Backend, string) {
	t.Helper()
	peer := "CPU"
	if _, _, ok := deviceMemory("CUDA1"); ok {
		peer = "cuda:1"
	}
	opts := swapOptions(t)
	opts[llamaopt.OptCombinedPeer] = peer
	for k, v := range extra {
		opts[k] = v
	}
	return load(t, swapModel(t, gguf.WeightF16, "", 0), nSlots, opts), peer
}

// experts splits the weights into those combined mode moves and the rest.
func experts(x *swapper) (moved, rest []weightPlace) {
	re := regexp.MustCompile(llamaopt.DefaultCombinedPattern)
	for _, w := range x.weights() {
		if re.MatchString(w.name) {
			moved = append(moved, w)
		} else {
			rest = append(rest, w)
		}
	}
	return moved, rest
}

// sameKernels reports whether the experts' home and the peer are devices
// of one kind (CPU and CPU, CUDA0 and CUDA1), whose kernels compute the
// same bits: only then must combined mode decode exactly what solo does (a
// GPU's experts on the CPU round differently).
func sameKernels(t *testing.T, b *Backend) bool {
	t.Helper()
	moved, _ := experts(b.eng.Load().swap)
	kind := func(d string) string { return strings.TrimRight(d, "0123456789") }
	return kind(moved[0].device) == kind(info(t, b).PeerDevice)
}

// TestCombined: "combined" places the experts on the peer (copies of their
// own, not the buffers llama.cpp loaded them into) and ggml runs their
// operations there; the model computes the same tokens, its states
// round-trip byte for byte, and "solo" puts the experts back.
func TestCombined(t *testing.T) {
	b, peer := combinedTest(t, 2, nil)
	x := b.eng.Load().swap
	if i := info(t, b); i.ExpertMode != "solo" || !i.PeerReachable || i.PeerDevice != strings.ReplaceAll(strings.ToUpper(peer), ":", "") {
		t.Fatalf("info before: mode %q, peer %q reachable %v", i.ExpertMode, i.PeerDevice, i.PeerReachable)
	}
	solo, strict := compute(t, b), sameKernels(t, b)
	if mode, err := b.SetExpertMode(context.Background(), "combined"); err != nil || mode != "combined" {
		t.Fatalf("SetExpertMode combined: %q, %v", mode, err)
	}
	moved, rest := experts(x)
	onPeer := 0
	for _, w := range moved {
		// A copy of its own on the peer, or (two GPUs, a layer llama.cpp
		// put on the peer) where it was loaded, already there.
		stayed := !w.peer && w.loaded
		if w.device != info(t, b).PeerDevice || !(w.peer && !w.loaded || stayed) {
			t.Errorf("combined: %s is %+v, want it on %s", w.name, w, info(t, b).PeerDevice)
		}
		if w.peer {
			onPeer++
		}
	}
	if onPeer == 0 {
		t.Fatal("combined moved no expert")
	}
	for _, w := range rest {
		if w.peer || !w.loaded {
			t.Errorf("combined: %s moved: %+v", w.name, w)
		}
	}
	if l := x.state.last; l.ops == 0 || l.opsLocal != l.ops {
		t.Errorf("of the decode graph's %d operations reading the experts, %d run where their weights are", l.ops, l.opsLocal)
	}
	if got := compute(t, b); !slices.Equal(got.tokens, solo.tokens) && strict {
		t.Errorf("combined decoded %v, solo %v", got.tokens, solo.tokens)
	} else if !slices.Equal(got.tokens, solo.tokens) {
		t.Logf("combined on another kind of device decoded %v, solo %v", got.tokens, solo.tokens)
	}
	if i := info(t, b); i.ExpertMode != "combined" || i.Model.Hash != fileHash(t, swapModel(t, gguf.WeightF16, "", 0)) {
		t.Errorf("info in combined mode: %+v", i)
	}
	checkStateRoundTrip(t, b)

	if mode, err := b.SetExpertMode(context.Background(), "solo"); err != nil || mode != "solo" {
		t.Fatalf("SetExpertMode solo: %q, %v", mode, err)
	}
	for _, w := range x.weights() {
		if w.peer || !w.loaded {
			t.Errorf("solo: %s is %+v, want the buffer it was loaded into", w.name, w)
		}
	}
	if got := compute(t, b); !same(got, solo) {
		t.Errorf("solo again decoded %v, first %v", got.tokens, solo.tokens)
	}
}

// checkStateRoundTrip saves slot 0 (after a prefill and a decode), restores
// it into slot 1 and checks that it re-saves byte for byte and decodes on
// alike.
func checkStateRoundTrip(t *testing.T, b *Backend) {
	t.Helper()
	prefill(t, b, 0, story)
	decode(t, b, 0, 4, iface.SamplerParams{})
	si, state := slotInfo(t, b, 0), stateOf(t, b, 0, 64<<10)
	if !bytes.Equal(state, reference(t, b, 0)) {
		t.Fatal("the streamed state differs from llama.cpp's")
	}
	if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
		t.Fatal(err)
	}
	if again := stateOf(t, b, 1, 1<<20); !bytes.Equal(normSeq(again), normSeq(state)) {
		t.Fatal("the restored state re-saves differently")
	}
	want, _ := decode(t, b, 0, 8, iface.SamplerParams{})
	if got, _ := decode(t, b, 1, 8, iface.SamplerParams{}); !slices.Equal(got, want) {
		t.Fatalf("the restored slot decoded %v, the original %v", got, want)
	}
}

// TestCombinedWithSwaps: a swap in combined mode gives the experts on the
// peer the new quantisation, computing what the oracle does; "solo" then
// brings the swapped experts home.
func TestCombinedWithSwaps(t *testing.T) {
	b, _ := combinedTest(t, 1, nil)
	oracle := compute(t, load(t, swapModel(t, gguf.WeightF16, expertWeights, gguf.WeightQ8_0), 1, map[string]string{llamaopt.OptNCtx: "512"}))
	strict := sameKernels(t, b)
	if mode, _ := b.SetExpertMode(context.Background(), "combined"); mode != "combined" {
		t.Fatalf("mode %q", mode)
	}
	if _, err := b.SwapQuant(context.Background(), "q8", expertWeights); err != nil {
		t.Fatal(err)
	}
	moved, _ := experts(b.eng.Load().swap)
	for _, w := range moved {
		if w.key != "q8" || w.device != info(t, b).PeerDevice {
			t.Errorf("swapped in combined mode: %s is %+v", w.name, w)
		}
	}
	if got := compute(t, b); !slices.Equal(got.tokens, oracle.tokens) && strict {
		t.Errorf("combined + q8 experts decoded %v, the oracle %v", got.tokens, oracle.tokens)
	}
	if mode, _ := b.SetExpertMode(context.Background(), "solo"); mode != "solo" {
		t.Fatalf("mode %q", mode)
	}
	if got := compute(t, b); !same(got, oracle) {
		t.Errorf("solo + q8 experts decoded %v, the oracle %v", got.tokens, oracle.tokens)
	}
	if i := info(t, b); i.ActiveQuant != "base+q8" || i.ExpertMode != "solo" {
		t.Errorf("info: %+v", i)
	}
}

// TestCombinedUnavailable: without a peer, with a peer this host lacks or
// a pattern matching nothing, "combined" answers "solo" and moves nothing;
// a pattern that does not compile fails Load.
func TestCombinedUnavailable(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts map[string]string
	}{
		{"no peer", nil},
		{"absent peer", map[string]string{llamaopt.OptCombinedPeer: "cuda:7"}},
		{"pattern matching nothing", map[string]string{llamaopt.OptCombinedPeer: "CPU", llamaopt.OptCombinedPattern: `blk\.\d+\.ffn_nothing=CUDA1`}},
	} {
		b := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, tc.opts)
		if mode, err := b.SetExpertMode(context.Background(), "combined"); err != nil || mode != "solo" {
			t.Errorf("%s: combined answered %q, %v", tc.name, mode, err)
		}
		if x := b.eng.Load().swap; x != nil {
			for _, w := range x.weights() {
				if w.peer || !w.loaded {
					t.Errorf("%s: %s moved", tc.name, w.name)
				}
			}
		}
		i := info(t, b)
		if want := tc.opts[llamaopt.OptCombinedPeer] == "CPU"; i.PeerReachable != want || i.ExpertMode != "solo" {
			t.Errorf("%s: info %+v", tc.name, i)
		}
	}
	_, err := New(testLogger()).Load(context.Background(), iface.LoadRequest{Model: swapModel(t, gguf.WeightF16, "", 0), NSlots: 1,
		Options: map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "512", llamaopt.OptCombinedPeer: "CPU", llamaopt.OptCombinedPattern: `blk\.(`}})
	if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), llamaopt.OptCombinedPattern) {
		t.Errorf("Load with a pattern that does not compile: %v", err)
	}
}

// TestSwapInfoWhileSwapping: Info answers at any time, also while swaps
// and mode changes run (the race detector's test), and always describes a
// state the engine was in.
func TestSwapInfoWhileSwapping(t *testing.T) {
	opts := swapOptions(t)
	opts[llamaopt.OptCombinedPeer] = "CPU"
	b := load(t, swapModel(t, gguf.WeightF16, "", 0), 1, opts)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			i, err := b.Info(context.Background())
			if err != nil || !slices.Contains([]string{"base", "q8", "base+q8"}, i.ActiveQuant) {
				done <- fmt.Errorf("info %+v, %v", i, err)
				return
			}
		}
	}()
	for range 10 {
		for _, step := range []func() error{
			func() error { _, err := b.SwapQuant(context.Background(), "q8", expertWeights); return err },
			func() error { _, err := b.SetExpertMode(context.Background(), "combined"); return err },
			func() error { _, err := b.SwapQuant(context.Background(), "q8", ".*"); return err },
			func() error { _, err := b.SetExpertMode(context.Background(), "solo"); return err },
			func() error { _, err := b.SwapQuant(context.Background(), "base", ".*"); return err },
		} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestCombinedWhileDecoding: "combined" and "solo" are switched while a
// slot decodes (the switch waits for no slot, only for the step running);
// the decode goes on, keeping its sequence, and gives the tokens it gives
// without the switches where the devices' kernels round alike.
func TestCombinedWhileDecoding(t *testing.T) {
	b, _ := combinedTest(t, 2, nil)
	strict := sameKernels(t, b)
	const prompt, n = "the weights of this model came from a file", 48
	prefill(t, b, 0, prompt)
	want, _ := decode(t, b, 0, n, iface.SamplerParams{})

	if err := b.ClearSlot(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	prefill(t, b, 0, prompt)
	modes := map[int]string{8: "combined", 24: "solo", 36: "combined"} // switched after these many tokens
	var got []int32
	var answered []string
	res, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: 0, NPredict: n}, func(tok iface.Token) error {
		got = append(got, tok.ID)
		if mode, ok := modes[len(got)]; ok {
			// From another goroutine, as a Hydra client's SET_EXPERT_MODE
			// comes, while this decode's slot is held.
			done := make(chan struct{})
			go func() {
				defer close(done)
				m, err := b.SetExpertMode(context.Background(), mode)
				if err != nil {
					t.Errorf("SetExpertMode %s during the decode: %v", mode, err)
				}
				answered = append(answered, m)
			}()
			<-done
		}
		return nil
	})
	if err != nil || res.StopReason != StopLength {
		t.Fatalf("the decode across the switches: %+v, %v", res, err)
	}
	if !slices.Equal(answered, []string{"combined", "solo", "combined"}) {
		t.Fatalf("SET_EXPERT_MODE answered %v during the decode, want each mode asked for", answered)
	}
	if !slices.Equal(got, want) && strict {
		t.Errorf("decoded %v across the switches, %v without", got, want)
	} else if !slices.Equal(got, want) {
		t.Logf("across the switches on another kind of device: %v, without %v", got, want)
	}
	if i := info(t, b); i.ExpertMode != "combined" {
		t.Errorf("mode after the decode %q", i.ExpertMode)
	}
	checkStateRoundTrip(t, b)
}
