//go:build llama && cgo

package cudallama

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/llamaopt"
)

// Weight placement on the tests' MoE model (gguf.TinyMoE, 4 layers of 4
// experts) in Q8_0: where each weight lands with override_tensor and
// n_cpu_moe, and that placement changes where weights are, not what the
// model computes. On CPU every weight is in host memory whatever is asked,
// so llama.cpp's own log of each override it applied is checked too; on a
// GPU (libggml-cuda.so beside the test binary) the placed weights are in
// host memory and the others on the GPU.

func moeModel(t testing.TB) string {
	c := gguf.TinyMoE()
	c.Type = gguf.WeightQ8_0
	return modelFile(t, "moe-q8_0", c)
}

// nodePlacement is a node configuration's placement on the tiny model: the
// experts of the first two layers and the embeddings, output norm and
// output head in host memory.
var nodePlacement = map[string]string{
	llamaopt.OptNCPUMoE:        "2",
	llamaopt.OptOverrideTensor: `token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU`,
	llamaopt.OptNGPULayers:     "all",
}

// placedWeights are the weights nodePlacement places. llama.cpp searches a
// pattern anywhere in the name, so output\.weight also takes every layer's
// attn_output.weight, in llama-server as here (^output\.weight$ would not).
var placedWeights = []string{
	"token_embd.weight", "output.weight", "output_norm.weight",
	"blk.0.attn_output.weight", "blk.1.attn_output.weight", "blk.2.attn_output.weight", "blk.3.attn_output.weight",
	"blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight", "blk.0.ffn_up_exps.weight",
	"blk.1.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight",
}

// logBuffer is an hclog sink the tests read back.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// loadLogged loads like load, logging everything (llama.cpp's debug lines
// included) into the returned buffer.
func loadLogged(t *testing.T, model string, opts map[string]string) (*Backend, *logBuffer, error) {
	t.Helper()
	logs := &logBuffer{}
	o := map[string]string{llamaopt.OptNThreads: "1", llamaopt.OptNCtx: "512"}
	for k, v := range opts {
		o[k] = v
	}
	b := New(hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs}))
	_, err := b.Load(context.Background(), iface.LoadRequest{Model: model, NSlots: 1, Options: o})
	return b, logs, err
}

// loadPlaced loads the model as Load does, on the GPU with every layer
// when there is one, with the placement p, logging everything (llama.cpp's
// debug lines included) into the returned buffer. It calls loadModel
// itself, so that it sees the placement whatever Load passes on.
func loadPlaced(t *testing.T, path string, p llamaopt.PlacementOptions) (*model, string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	b := New(hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs}))
	b.initLlama()
	gpu, name := b.loadGPU(llamaopt.Defaults())
	m, err := loadModel(path, modelParams{nGPULayers: b.gpuLayers(-1, gpu != nil), mmap: true, placement: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.free)
	dev, _, _ := strings.Cut(name, " (")
	return m, dev, logs
}

// placedOn reads where the loaded model's weights are: name → memory.
func placedOn(m *model) map[string]string {
	out := map[string]string{}
	for _, p := range placements(m.m, nil) {
		out[p.name] = p.memory
	}
	return out
}

func TestPlacementBuffers(t *testing.T) {
	path := moeModel(t)
	plain, _, _ := loadPlaced(t, path, llamaopt.PlacementOptions{})
	o, err := llamaopt.Parse(nodePlacement)
	if err != nil {
		t.Fatal(err)
	}
	placed, gpu, logs := loadPlaced(t, path, o.PlacementOptions)
	before, after := placedOn(plain), placedOn(placed)
	if len(after) != len(before) || len(after) == 0 {
		t.Fatalf("%d weights placed, %d without placement", len(after), len(before))
	}
	t.Logf("device %q", gpu)
	for name, mem := range after {
		want := before[name]
		if slices.Contains(placedWeights, name) {
			want = llamaopt.CPUDevice
			// With a GPU, llama.cpp puts weights overridden to the CPU in
			// the GPU's pinned host buffer type, so that they upload fast.
			if gpu != "" && isHostBuffer(mem) {
				want = mem
			}
		}
		if mem != want {
			t.Errorf("%s is in %s memory, want %s (without placement: %s)", name, mem, want, before[name])
		}
		if gpu != "" && !slices.Contains(placedWeights, name) && mem != gpu {
			t.Errorf("%s is in %s memory, want the GPU's (%s)", name, mem, gpu)
		}
	}
	// llama.cpp says which override it applied to each weight, on CPU too.
	for _, name := range placedWeights {
		if !overriddenToCPU(logs.String(), name) {
			t.Errorf("llama.cpp did not override %s's buffer type:\n%s", name, grepLines(logs.String(), "overridden"))
		}
	}
	if n := strings.Count(logs.String(), "buffer type overridden to"); n != len(placedWeights) {
		t.Errorf("llama.cpp overrode %d weights, want %d:\n%s", n, len(placedWeights), grepLines(logs.String(), "overridden"))
	}
	for _, line := range []string{`hydra: placement blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU: 3 weights`,
		`hydra: placement output_norm\.weight=CPU: 1 weights: output_norm.weight in `,
		`hydra: placement output\.weight=CPU: 5 weights: output.weight in `} {
		if !strings.Contains(logs.String(), line) {
			t.Errorf("no log line %q:\n%s", line, grepLines(logs.String(), "hydra: placement"))
		}
	}
}

// overriddenToCPU reports whether llama.cpp's debug line for name says it
// was overridden to the CPU buffer type.
func overriddenToCPU(logs, name string) bool {
	for line := range strings.Lines(logs) {
		_, to, ok := strings.Cut(line, "buffer type overridden to ")
		if strings.Contains(line, "tensor "+name+" (") && ok && (strings.HasPrefix(to, "CPU") || isHostBuffer(strings.TrimSpace(to))) {
			return true
		}
	}
	return false
}

// isHostBuffer reports whether a buffer type is a GPU backend's host
// memory (CUDA_Host: pinned memory of the CPU).
func isHostBuffer(name string) bool { return strings.HasSuffix(name, "_Host") }

func grepLines(logs, s string) string {
	var out []string
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return strings.Join(out, "\n")
}

// Placement moves weights, not results: greedy tokens are the same with
// and without it.
func TestPlacementSameTokens(t *testing.T) {
	model := moeModel(t)
	var runs [][]int32
	for _, opts := range []map[string]string{{llamaopt.OptNGPULayers: "all"}, nodePlacement} {
		b, logs, err := loadLogged(t, model, opts)
		if err != nil {
			t.Fatal(err)
		}
		if opts[llamaopt.OptNCPUMoE] != "" && !strings.Contains(logs.String(), "buffer type overridden to") {
			t.Fatalf("Load did not apply the placement options (llama.cpp logged no override)")
		}
		prefill(t, b, 0, story)
		ids, _ := decode(t, b, 0, 24, iface.SamplerParams{})
		runs = append(runs, ids)
	}
	if len(runs[0]) == 0 || !slices.Equal(runs[0], runs[1]) {
		t.Fatalf("greedy tokens differ:\n without placement %v\n with placement    %v", runs[0], runs[1])
	}
}

// A placement the model or the machine cannot have fails Load with what is
// wrong, before the model loads.
func TestPlacementErrors(t *testing.T) {
	model := moeModel(t)
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{llamaopt.OptOverrideTensor: `output\.weight=NPU7`}, `device "NPU7" is not one ggml has here; known: CPU`},
		{map[string]string{llamaopt.OptOverrideTensor: `blk\.(0=CPU`}, `pattern "blk\.(0" is not a regular expression llama.cpp can use`},
	} {
		_, _, err := loadLogged(t, model, tc.opts)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want ErrBadRequest mentioning %q", tc.opts, err, tc.want)
		}
	}
	// n_cpu_moe beyond the model's blocks names every block, as
	// llama-server applies it, and says so.
	for _, n := range []int{gguf.TinyMoE().Layers, gguf.TinyMoE().Layers + 4} {
		b, logs, err := loadLogged(t, model, map[string]string{llamaopt.OptNCPUMoE: fmt.Sprint(n)})
		if err != nil {
			t.Fatalf("n_cpu_moe = %d: %v", n, err)
		}
		for _, tp := range placements(b.eng.Load().model.m, nil) {
			if regexp.MustCompile(`ffn_(up|down|gate)_exps`).MatchString(tp.name) && tp.memory != "CPU" {
				t.Errorf("n_cpu_moe = %d: %s in %s", n, tp.name, tp.memory)
			}
		}
		note := fmt.Sprintf("option n_cpu_moe=%d: the model has %d blocks: every block's expert weights stay in host memory", n, gguf.TinyMoE().Layers)
		if strings.Contains(logs.String(), note) != (n > gguf.TinyMoE().Layers) {
			t.Errorf("n_cpu_moe = %d: the note %q in the log: %v", n, note, strings.Contains(logs.String(), note))
		}
	}
}

// An override that matches nothing is loaded, with a warning naming it.
func TestPlacementNoMatchWarns(t *testing.T) {
	_, logs, err := loadLogged(t, moeModel(t), map[string]string{llamaopt.OptOverrideTensor: `ffn_gate_exp\.weight=CPU`})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `[WARN]  llama.cpp: hydra: placement ffn_gate_exp\.weight=CPU placed no weight of the model`) {
		t.Errorf("no warning:\n%s", grepLines(logs.String(), "placement"))
	}
}

// The dense tiny model and a qwen3moe model at every weight type load and
// decode greedily on CPU.
func TestMoEModelsDecode(t *testing.T) {
	for _, wt := range []gguf.WeightType{gguf.WeightF32, gguf.WeightF16, gguf.WeightQ8_0, gguf.WeightQ4_0} {
		c := gguf.TinyMoE()
		c.Type = wt
		b := load(t, modelFile(t, "moe-"+wt.String(), c), 1, nil)
		prefill(t, b, 0, story)
		if ids, _ := decode(t, b, 0, 8, iface.SamplerParams{}); len(ids) != 8 {
			t.Errorf("%s: %d tokens", wt, len(ids))
		}
		if d := b.eng.Load().model.desc(); !strings.Contains(d, "qwen3moe") {
			t.Errorf("%s: model %q", wt, d)
		}
	}
}
