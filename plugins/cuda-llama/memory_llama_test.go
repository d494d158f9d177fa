//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/internal/llama"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// memoryModels are the test models of each memory kind the plugin streams:
// a plain cache (llama, and a MoE), a sliding window (gemma3: window 32,
// every sixth block global) and a hybrid of attention and gated DeltaNet
// (qwen35moe, the Hydra nodes' architecture).
var memoryModels = []struct {
	name, memory string
	c            gguf.Config
}{
	{"llama", "kv", gguf.Tiny()},
	{"qwen3moe", "kv", gguf.TinyMoE()},
	{"gemma3", "iswa", gguf.TinyGemma3()},
	{"qwen35moe", "hybrid", gguf.TinyQwen35MoE()},
}

// longStory is longer than gemma3's window, so its window cache drops cells.
var longStory = strings.Repeat("A state moves between engines, and the window slides on. ", 3)

// partOffsets walks a state by the layout: each part's first byte and cell
// count (the layout's sizes for those counts must account for every byte).
func partOffsets(t testing.TB, l stateLayout, state []byte) (offs, cells []int) {
	t.Helper()
	off := 0
	for _, p := range l.Parts {
		at := off
		if p.Kind == partKV {
			at += 4
		}
		if at+4 > len(state) {
			t.Fatalf("state of %d bytes ends before part %d's cell count", len(state), len(offs))
		}
		n := int(binary.LittleEndian.Uint32(state[at:]))
		offs, cells = append(offs, off), append(cells, n)
		off += int(p.size(n))
	}
	if off != len(state) {
		t.Fatalf("the layout's parts hold %d bytes, the state %d", off, len(state))
	}
	return offs, cells
}

// normSeqs zeroes the sequence ids in every KV part's cells (they name the
// slot the state was saved from).
func normSeqs(t testing.TB, l stateLayout, state []byte) []byte {
	s := bytes.Clone(state)
	offs, cells := partOffsets(t, l, s)
	for i, p := range l.Parts {
		if p.Kind != partKV {
			continue
		}
		for c := range cells[i] {
			binary.LittleEndian.PutUint32(s[offs[i]+8+c*int(p.CellMeta)+int(p.CellMeta)-4:], 0)
		}
	}
	return s
}

// TestMemoryKinds: each memory kind loads with the layout of its parts; its
// streamed state is llama.cpp's own (a recurrent one followed by its
// logits); a state moved to another engine of another slot count, and back
// into its own after a clear, decodes as the source does; with the K/V
// blocks held and streamed.
func TestMemoryKinds(t *testing.T) {
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			src := load(t, path, 2, nil)
			e := src.eng.Load()
			if e.layout.Memory != m.memory {
				t.Fatalf("memory %q, want %q (layout %+v)", e.layout.Memory, m.memory, e.layout)
			}
			var desc map[string]any
			if err := json.Unmarshal([]byte(e.info.StateLayout), &desc); err != nil || desc["memory"] != m.memory || desc["arch"] != m.c.Arch {
				t.Fatalf("StateLayout %s (%v): want memory %s, arch %s", e.info.StateLayout, err, m.memory, m.c.Arch)
			}
			t.Logf("StateLayout %s", e.info.StateLayout)
			if si := slotInfo(t, src, 0); si.StateSize != e.layout.size(0) || int64(len(stateOf(t, src, 0, 1<<20))) != si.StateSize {
				t.Fatalf("empty slot: StateSize %d, layout's %d", si.StateSize, e.layout.size(0))
			}
			prefill(t, src, 1, "a neighbour in the cache")
			prefill(t, src, 0, longStory)
			decode(t, src, 0, 5, iface.SamplerParams{})
			si := slotInfo(t, src, 0)
			state := stateOf(t, src, 0, 4093)
			ref := reference(t, src, 0)
			extra := 0
			if e.layout.recurrent() {
				extra = 4 * e.model.nVocab
			}
			if int64(len(state)) != si.StateSize || len(state) != len(ref)+extra || !bytes.Equal(state[:len(ref)], ref) {
				t.Fatalf("streamed %d bytes, StateSize %d, llama.cpp's state %d (+%d logits); equal %v",
					len(state), si.StateSize, len(ref), extra, bytes.Equal(state[:min(len(ref), len(state))], ref))
			}
			_, cells := partOffsets(t, e.layout, ref)
			t.Logf("%s: %d tokens, parts %v cells, %d bytes, max row %d", e.layout.Memory, si.NPast, cells, len(state), e.layout.MaxRow)
			want, wantRes := decode(t, src, 0, 24, iface.SamplerParams{})

			for _, mode := range restoreModes {
				streamBlocks(t, mode.stream, mode.stream)
				dst := load(t, path, 3, nil)
				prefill(t, dst, 0, "something else first")
				for _, slot := range []int{2, 0} {
					n, err := dst.StatePut(context.Background(), slot, si.Tokens, bytes.NewReader(state), int64(len(state)))
					if err != nil || n != int64(len(ref)) { // the state's bytes, its logits apart
						t.Fatalf("%s slot %d: StatePut %d, %v", mode.name, slot, n, err)
					}
					if got := slotInfo(t, dst, slot); got.NPast != si.NPast || got.StateSize != si.StateSize {
						t.Fatalf("%s slot %d: restored %+v, want %+v", mode.name, slot, got, si)
					}
					again := stateOf(t, dst, slot, 1<<20)
					if !bytes.Equal(normSeqs(t, e.layout, again[:len(ref)]), normSeqs(t, e.layout, ref)) || !bytes.Equal(again[len(ref):], state[len(ref):]) {
						t.Fatalf("%s slot %d: the restored state re-saves differently", mode.name, slot)
					}
					got, res := decode(t, dst, slot, 24, iface.SamplerParams{})
					if !slices.Equal(got, want) || !reflect.DeepEqual(res, wantRes) {
						t.Fatalf("%s slot %d: decoded %v (%+v), the source %v (%+v)", mode.name, slot, got, res, want, wantRes)
					}
				}
			}
		})
	}
}

// TestMemoryBatchedEqualsAlone: three sequences decoding together give each
// the tokens it gives alone (greedy, ggml's reference kernels; on a GPU up
// to a tie, sameGreedy).
func TestMemoryBatchedEqualsAlone(t *testing.T) {
	prompts := []string{longStory, "short one", "a third, of middling length, to batch"}
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			b := load(t, path, 3, nil)
			referenceKernels(t, b)
			for s, p := range prompts {
				prefill(t, b, s, p)
			}
			got := make([][]int32, len(prompts))
			var wg sync.WaitGroup
			for s := range prompts {
				wg.Go(func() {
					_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: s, NPredict: 30},
						func(tok iface.Token) error { got[s] = append(got[s], tok.ID); return nil })
					if err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			for s, p := range prompts {
				alone := load(t, path, 1, nil)
				referenceKernels(t, alone)
				prefill(t, alone, 0, p)
				prompt := alone.eng.Load().cells.Slots[0].Seq()
				want, _ := decode(t, alone, 0, 30, iface.SamplerParams{})
				sameGreedy(t, alone, 0, prompt, got[s], want, iface.SamplerParams{})
			}
		})
	}
}

// TestMemoryPromptReuse: a prompt that extends a slot's sequence reuses all
// of it on every kind; one that diverges reuses the common prefix where the
// memory can be cut there (a plain cache; a sliding window while its cache
// still holds the window before the cut), else what a context checkpoint
// serves (checkpoints.go): none of the first prompt's (taken 4 and 516
// tokens before its end) lies before the points these part at, but the
// third case's prompt left one at its N − 4, position 10, which the last
// case restores (a window's ends a position early, llama-server's
// [TAG_CHECKPOINTS_FIX_POS_MIN]: 9); the tokens decoded after are those of a
// fresh engine.
func TestMemoryPromptReuse(t *testing.T) {
	base := seqTokens(t, 60)
	longer := append(slices.Clone(base), seqTokens(t, 70)[60:]...)
	diverged := append(slices.Clone(base[:50]), 7, 8, 9, 10)
	early := append(slices.Clone(base[:10]), 7, 8, 9, 10)
	long := seqTokens(t, 1500) // past the window cache's cells: their early positions are overwritten
	longEarly := append(slices.Clone(long[:10]), 7, 8, 9, 10)
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			b := load(t, path, 1, nil)
			fresh := load(t, path, 1, nil)
			for _, c := range []struct {
				name        string
				first, then []int32
				reuse       map[string]int // by memory kind
			}{
				{"extends", base, longer, map[string]int{"kv": 60, "iswa": 60, "hybrid": 60}},
				{"diverges", base, diverged, map[string]int{"kv": 50, "iswa": 50, "hybrid": 0}},
				{"diverges early", base, early, map[string]int{"kv": 10, "iswa": 10, "hybrid": 0}},
				{"diverges early in a long sequence", long, longEarly, map[string]int{"kv": 10, "iswa": 9, "hybrid": 10}},
			} {
				prefillTokens(t, b, 0, c.first)
				res := prefillTokens(t, b, 0, c.then)
				if want := c.reuse[m.memory]; res.Reused != want {
					t.Errorf("%s: reused %d tokens, want %d", c.name, res.Reused, want)
				}
				got, _ := decode(t, b, 0, 12, iface.SamplerParams{})
				prefillTokens(t, fresh, 0, c.then)
				if want, _ := decode(t, fresh, 0, 12, iface.SamplerParams{}); !slices.Equal(got, want) {
					t.Errorf("%s: decoded %v after reuse, %v fresh", c.name, got, want)
				}
				if err := fresh.ClearSlot(context.Background(), 0); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// seqTokens is n token ids of the test models' vocabulary, none special.
func seqTokens(t testing.TB, n int) []int32 {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(100 + (i*37)%300)
	}
	return toks
}

// TestMemoryStateRefused: a state whose parts' counts or positions are not
// what the sequence needs is refused before llama.cpp acts on them, the
// slot left empty and the engine serving; a recurrent state without its
// logits is evaluated again and decodes as the source.
func TestMemoryStateRefused(t *testing.T) {
	for _, m := range memoryModels[2:] {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			b := load(t, path, 2, nil)
			e := b.eng.Load()
			prefill(t, b, 0, longStory)
			si := slotInfo(t, b, 0)
			state := stateOf(t, b, 0, 1<<20)
			ref := reference(t, b, 0)
			want, _ := decode(t, b, 0, 10, iface.SamplerParams{})
			offs, cells := partOffsets(t, e.layout, ref)
			last := len(e.layout.Parts) - 1
			lp := e.layout.Parts[last]
			countAt := offs[last]
			if lp.Kind == partKV {
				countAt += 4
			}
			set := func(off int, v uint32) []byte {
				s := bytes.Clone(state)
				binary.LittleEndian.PutUint32(s[off:], v)
				return s
			}
			for _, c := range []struct {
				name  string
				state []byte
				want  string
			}{
				{"last part's count 2^32-1", set(countAt, 0xffffffff), "cells, want"},
				{"last part's count 0", set(countAt, 0), "cells, want"},
				{"last part's first position", set(countAt+4, uint32(len(si.Tokens)+5)), "position"},
				{"last part's cell sequences", set(countAt+8, 3), "sequences"},
				{"cut in the last part", state[:offs[last]+int(lp.size(cells[last]))/2], ""},
			} {
				_, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(c.state), int64(len(c.state)))
				if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %v, want ErrBadRequest with %q", c.name, err, c.want)
				}
				if got := slotInfo(t, b, 1); got.NPast != 0 || got.StateSize != e.layout.size(0) {
					t.Errorf("%s: slot after the refusal %+v", c.name, got)
				}
			}
			if lp.Kind == partKV {
				s := set(offs[last], 2)
				if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(s), int64(len(s))); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "streams") {
					t.Errorf("window part of 2 streams: %v", err)
				}
			}
			// Without the logits a recurrent state carries, the sequence is
			// evaluated again: the same tokens follow.
			bare := state[:len(ref)]
			if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(bare), int64(len(bare))); err != nil {
				t.Fatal(err)
			}
			if got, _ := decode(t, b, 1, 10, iface.SamplerParams{}); !slices.Equal(got, want) {
				t.Errorf("restored without logits: %v, want %v", got, want)
			}
		})
	}
}

// TestStateLayoutNamesTheCache: engines whose states cannot restore into
// each other (another K/V type, V transposed) name different layouts; two
// quantisations of one model's weights, the same.
func TestStateLayoutNamesTheCache(t *testing.T) {
	c := gguf.TinyQwen35MoE()
	f16 := modelFile(t, "mem-qwen35moe", c)
	c.F16 = true
	other := modelFile(t, "mem-qwen35moe-f16", c)
	layout := func(path string, opts map[string]string) string {
		return load(t, path, 1, opts).eng.Load().info.StateLayout
	}
	base := layout(f16, nil)
	if got := layout(other, nil); got != base {
		t.Errorf("another quantisation of the weights: %s, want %s", got, base)
	}
	for name, opts := range map[string]map[string]string{
		"q8_0 cache":     {llamaopt.OptCacheTypeK: "q8_0", llamaopt.OptCacheTypeV: "q8_0"},
		"flash attn off": {llamaopt.OptFlashAttn: "off"},
	} {
		if got := layout(f16, opts); got == base {
			t.Errorf("%s: the same layout %s", name, got)
		}
	}
}

// TestNonFiniteStateRefused: a state holding an Inf or NaN where no cache
// can (an f16 K row, a q8_0 block's scale, a recurrent state's f32) is
// refused, the slot left empty; the same state unchanged restores.
func TestNonFiniteStateRefused(t *testing.T) {
	hd32 := func() gguf.Config { c := gguf.Tiny(); c.Heads, c.KVHeads = 2, 1; return c }()
	for _, tc := range []struct {
		name  string
		c     gguf.Config
		opts  map[string]string
		value []byte // written at the value's place
		last  bool   // the state's last value (a recurrent part's S row) instead of the first K row's first
	}{
		{"f16 K row, NaN", gguf.Tiny(), nil, []byte{0x00, 0x7e}, false},
		{"f16 K row, Inf", gguf.Tiny(), nil, []byte{0x00, 0x7c}, false},
		{"q8_0 block scale, Inf", hd32, map[string]string{llamaopt.OptCacheTypeK: "q8_0", llamaopt.OptCacheTypeV: "q8_0"}, []byte{0x00, 0xfc}, false},
		{"recurrent f32, NaN", gguf.TinyQwen35MoE(), nil, []byte{0x00, 0x00, 0xc0, 0x7f}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := load(t, modelFile(t, "nf-"+tc.c.Arch+fmt.Sprint(tc.c.Heads), tc.c), 2, tc.opts)
			e := b.eng.Load()
			prefill(t, b, 0, story)
			si := slotInfo(t, b, 0)
			state := stateOf(t, b, 0, 1<<20)
			ref := reference(t, b, 0)
			at := 8 + len(si.Tokens)*int(e.layout.Parts[0].CellMeta) + 8 + 4 + 8 // the first K row's first value
			if tc.last {
				at = len(ref) - len(tc.value)
			}
			bad := bytes.Clone(state)
			copy(bad[at:], tc.value)
			_, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(bad), int64(len(bad)))
			if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "Inf or NaN") {
				t.Fatalf("%v, want ErrBadRequest naming the Inf or NaN", err)
			}
			if got := slotInfo(t, b, 1); got.NPast != 0 {
				t.Fatalf("slot after the refusal: %+v", got)
			}
			if _, err := b.StatePut(context.Background(), 1, si.Tokens, bytes.NewReader(state), int64(len(state))); err != nil {
				t.Fatalf("the state unchanged: %v", err)
			}
		})
	}
}

// decodeBeside decodes 48 tokens in slots 0 and 1 at once and runs beside
// (nil: nothing) until they end, which closing its channel says; it returns
// each slot's tokens.
func decodeBeside(t *testing.T, b *Backend, beside func(decoding <-chan struct{})) [2][]int32 {
	t.Helper()
	var got [2][]int32
	var decoders, all sync.WaitGroup
	for s := range 2 {
		decoders.Go(func() {
			_, err := b.Decode(context.Background(), iface.DecodeRequest{Slot: s, NPredict: 48},
				func(tok iface.Token) error { got[s] = append(got[s], tok.ID); return nil })
			if err != nil {
				t.Error(err)
			}
		})
	}
	decoding := make(chan struct{})
	if beside != nil {
		all.Go(func() { beside(decoding) })
	}
	decoders.Wait()
	close(decoding)
	all.Wait()
	return got
}

// TestStateGetBesideDecode: a slot's state, taken over and over (staged and
// into a ChunkWriter's buffers) while the other slots decode, is byte for
// byte the state taken alone, for each memory kind, with one KV cache and
// with a stream per slot; and the dense models' decodes beside it give the
// tokens they give alone. The state's data is read without the context lock
// (StatePlan.Save), beside the other slots' steps.
func TestStateGetBesideDecode(t *testing.T) {
	for _, m := range memoryModels {
		for _, unified := range []string{"true", "false"} {
			t.Run(m.name+"/kv_unified="+unified, func(t *testing.T) {
				path := modelFile(t, "mem-"+m.name, m.c)
				opts := map[string]string{llamaopt.OptKVUnified: unified}
				var alone []byte // slot 2's state, taken before the decodes
				// run fills the slots and decodes in slots 0 and 1 with beside
				// beside them (decodeBeside).
				run := func(b *Backend, beside func(decoding <-chan struct{})) [2][]int32 {
					referenceKernels(t, b) // batched equals alone
					// Slot 2's recurrent cell between the decoders': llama.cpp
					// reorders a recurrent memory's cells so that a batch's
					// sequences' are contiguous, moving slot 2's.
					prefill(t, b, 1, "second of the decoders")
					prefill(t, b, 2, longStory)
					prefill(t, b, 0, "first of the decoders")
					alone = stateOf(t, b, 2, 1<<20)
					return decodeBeside(t, b, beside)
				}
				want := run(load(t, path, 3, opts), nil)

				b := load(t, path, 3, opts)
				takes := 0
				got := run(b, func(decoding <-chan struct{}) {
					for k := 0; ; k++ {
						select {
						case <-decoding:
							return
						default:
						}
						var data []byte
						var err error
						if k%2 == 0 {
							var w recorder
							_, err = b.StateGet(context.Background(), 2, 4093, &w)
							data = w.data
						} else {
							w := &chunkWriter{bufSize: 65536}
							_, err = b.StateGet(context.Background(), 2, 1<<20, w)
							w.flush()
							data = w.data
						}
						if err != nil || !bytes.Equal(data, alone) {
							t.Errorf("take %d beside the decodes: %v; %d bytes, equal to alone (%d): %v", k, err, len(data), len(alone), bytes.Equal(data, alone))
							return
						}
						takes++
					}
				})
				t.Logf("%d takes of the state while the slots decoded", takes)
				for s := range 2 {
					// A MoE's tokens may part at a tie where the steps' batches
					// differ (TestMemoryBatchedEqualsAlone's sameGreedy).
					if !slices.Equal(got[s], want[s]) && m.c.Experts == 0 {
						t.Errorf("slot %d decoded %v beside the state's takes, %v without", s, got[s], want[s])
					}
				}
			})
		}
	}
}

// slowReader hands out its bytes a piece at a time with a pause before
// each, so that a restore waits on it (and lets the context lock go).
type slowReader struct {
	b     []byte
	piece int
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	time.Sleep(200 * time.Microsecond)
	n := copy(p[:min(len(p), r.piece)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestStatePutBesideDecode: a state restored over and over into a slot, its
// bytes arriving slowly (the restore lets the context lock go while it
// waits), while the other slots decode, re-saves each time as it came, for
// each memory kind. (The decoders' tokens are not compared with theirs
// alone: the restores move the cells theirs land in, and the attention's
// sums follow the cells' order.)
func TestStatePutBesideDecode(t *testing.T) {
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			path := modelFile(t, "mem-"+m.name, m.c)
			src := load(t, path, 1, nil)
			prefill(t, src, 0, longStory)
			si, state, ref := slotInfo(t, src, 0), stateOf(t, src, 0, 1<<20), reference(t, src, 0)
			n := len(ref) // the state's bytes, before a recurrent state's logits

			b := load(t, path, 3, nil)
			prefill(t, b, 1, "second of the decoders")
			prefill(t, b, 2, "a short one")
			prefill(t, b, 0, "first of the decoders")
			l := b.eng.Load().layout
			puts := 0
			decodeBeside(t, b, func(decoding <-chan struct{}) {
				for {
					select {
					case <-decoding:
						return
					default:
					}
					if _, err := b.StatePut(context.Background(), 2, si.Tokens, &slowReader{b: state, piece: 4096}, int64(len(state))); err != nil {
						t.Errorf("StatePut beside the decodes: %v", err)
						return
					}
					puts++
					again := stateOf(t, b, 2, 1<<20)
					if len(again) != len(state) || !bytes.Equal(normSeqs(t, l, again[:n]), normSeqs(t, l, state[:n])) || !bytes.Equal(again[n:], state[n:]) {
						t.Errorf("restore %d beside the decodes re-saves differently", puts)
						return
					}
				}
			})
			t.Logf("%d restores while the slots decoded", puts)
		})
	}
}

// exactSource lends a restore exactly the bytes it asks for, from memory
// outside Go, so that the lock's log knows where the restore is.
type exactSource struct {
	b        []byte
	pos, end int // released, and the end of what was lent last
}

func (s *exactSource) Next(release, need int) ([]byte, error) {
	s.pos += release
	if s.pos+need > len(s.b) {
		return nil, io.ErrUnexpectedEOF
	}
	s.end = s.pos + need
	return s.b[s.pos:s.end], nil
}

// lockLog is a restore's context lock that logs where it was let go and
// taken back.
type lockLog struct {
	mu   sync.Locker
	src  *exactSource
	ops  []string
	held bool
}

func (l *lockLog) Lock() {
	l.mu.Lock()
	l.held = true
	l.ops = append(l.ops, fmt.Sprintf("lock@%d", l.src.end))
}

func (l *lockLog) Unlock() {
	l.ops = append(l.ops, fmt.Sprintf("unlock@%d", l.src.end))
	l.held = false
	l.mu.Unlock()
}

// TestRestoreLetsTheLockGo: a restore writes a KV part's rows without the
// context lock, from its first row to the part's end, and holds it
// everywhere else: every part's metadata (llama.cpp takes cells there) and a
// recurrent part (its cell moves when other sequences decode); a refused
// field among the rows is refused with the lock taken back (llama.cpp frees
// the cells then).
func TestRestoreLetsTheLockGo(t *testing.T) {
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			b := load(t, modelFile(t, "mem-"+m.name, m.c), 2, nil)
			prefill(t, b, 0, longStory)
			e := b.eng.Load()
			l := e.layout
			n := len(slotInfo(t, b, 0).Tokens)
			full := stateOf(t, b, 0, 1<<20)
			offs, cells := partOffsets(t, l, full[:len(reference(t, b, 0))])
			last := len(l.Parts) - 1
			size := offs[last] + int(l.Parts[last].size(cells[last]))

			var want []string
			held, firstRows := true, -1
			for i, p := range l.Parts {
				if !held {
					want, held = append(want, fmt.Sprintf("lock@%d", offs[i]+4)), true // its first field
				}
				if p.Kind == partKV && cells[i] > 0 {
					rows := offs[i] + 8 + cells[i]*int(p.CellMeta)
					want, held = append(want, fmt.Sprintf("unlock@%d", rows+20)), false // v_trans, n_layer, K type and row size
					if firstRows < 0 {
						firstRows = rows
					}
				}
			}
			if !held {
				want = append(want, fmt.Sprintf("lock@%d", size))
			}
			restore := func(state []byte) (*lockLog, error) {
				buf := mmapCopy(t, state[:size])
				src := &exactSource{b: buf}
				lk := &lockLog{mu: &e.mu, src: src, held: true}
				lp := llama.LoadParams{Size: int64(size), Rules: bindingRules(l.rules(n)), NTokens: n, Lock: lk}
				e.mu.Lock()
				defer e.mu.Unlock()
				_, err := e.ctx.binding().LoadState(1, src, lp)
				if !lk.held {
					t.Errorf("LoadState returned without the lock (%v)", lk.ops)
				}
				e.ctx.SeqRm(1)
				return lk, err
			}
			lk, err := restore(full)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(lk.ops, want) {
				t.Errorf("the lock went %v, want %v", lk.ops, want)
			}
			if firstRows < 0 {
				return
			}
			// Layer 1's K type, after layer 0's rows: refused, the lock taken back first.
			kRow := int(binary.LittleEndian.Uint64(full[firstRows+12:]))
			bad := firstRows + 20 + cells[0]*kRow
			state := bytes.Clone(full)
			binary.LittleEndian.PutUint32(state[bad:], 99)
			lk, err = restore(state)
			if err == nil || !strings.Contains(err.Error(), "(byte 20 of their fields: 99,") {
				t.Fatalf("a bad K type in layer 1: err %v", err)
			}
			if w := []string{want[0], fmt.Sprintf("lock@%d", bad+4)}; !slices.Equal(lk.ops, w) {
				t.Errorf("refused: the lock went %v, want %v", lk.ops, w)
			}
		})
	}
}

// smallReads hands out at most n bytes a Read, so that a restore takes
// many pieces.
type smallReads struct {
	r io.Reader
	n int
}

func (s smallReads) Read(p []byte) (int, error) { return s.r.Read(p[:min(len(p), s.n)]) }

// TestStateGetBesidePut: a save and a restore run side by side (one of each
// at a time): STATE_GETs of one slot while STATE_PUTs fill another, on every
// memory kind, each in small pieces so that they interleave. Every save
// gives the slot's bytes as alone, and the restored slot decodes as the
// slot it was saved from.
func TestStateGetBesidePut(t *testing.T) {
	sp := iface.SamplerParams{}
	for _, m := range memoryModels {
		t.Run(m.name, func(t *testing.T) {
			b := load(t, modelFile(t, "mem-"+m.name, m.c), 3, nil)
			prefillTokens(t, b, 0, seqTokens(t, 300))
			src := seqTokens(t, 250)[40:]
			prefillTokens(t, b, 1, src)
			want0 := stateOf(t, b, 0, 4096)
			blob := stateOf(t, b, 1, 4096)
			var wg sync.WaitGroup
			var getErr, putErr error
			wg.Add(2)
			go func() {
				defer wg.Done()
				for range 20 {
					var w recorder
					if _, err := b.StateGet(context.Background(), 0, 4096, &w); err != nil || !bytes.Equal(w.data, want0) {
						getErr = fmt.Errorf("a STATE_GET beside STATE_PUTs: %v, %d bytes equal to alone's: %v", err, len(w.data), bytes.Equal(w.data, want0))
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for range 20 {
					if _, err := b.StatePut(context.Background(), 2, src, smallReads{bytes.NewReader(blob), 1024}, int64(len(blob))); err != nil {
						putErr = fmt.Errorf("a STATE_PUT beside STATE_GETs: %w", err)
						return
					}
				}
			}()
			wg.Wait()
			if getErr != nil || putErr != nil {
				t.Fatal(errors.Join(getErr, putErr))
			}
			want, _ := decode(t, b, 1, 8, sp)
			got, _ := decode(t, b, 2, 8, sp)
			if !slices.Equal(got, want) {
				t.Fatalf("the restored slot decodes %v, the slot it was saved from %v", got, want)
			}
		})
	}
}
