package pluginproc_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/host/pluginproc"
	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/transport"
)

// TestEngineStartsVariant runs a real engine on `--backend v --plugin-dir
// DIR` where DIR holds the mock plugin as hydra-plugin-v and as its variant
// for this CPU's level: the engine must log the choice and run the variant.
func TestEngineStartsVariant(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the engine")
	}
	level := pluginproc.DetectCPU().Level
	if level < pluginproc.LevelV2 {
		t.Skipf("CPU level %s: no variant applies", level)
	}
	bin := t.TempDir()
	if err := enginetest.Build(bin, enginetest.BuildOptions{Commands: []string{"hydra-engine", "hydra-plugin-mock"}}); err != nil {
		t.Fatal(err)
	}
	plugins := t.TempDir()
	mock, err := os.ReadFile(filepath.Join(bin, "hydra-plugin-mock"))
	if err != nil {
		t.Fatal(err)
	}
	variant := filepath.Join(plugins, "hydra-plugin-v."+level.String())
	for _, p := range []string{filepath.Join(plugins, "hydra-plugin-v"), variant} {
		if err := os.WriteFile(p, mock, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e, err := enginetest.Start(ctx, enginetest.Config{Bin: bin, Backend: "v", Args: []string{"--plugin-dir", plugins}, WaitInfo: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	logs := e.Logs.String()
	if want := fmt.Sprintf("variant=%s path=%s", level, variant); !strings.Contains(logs, "backend plugin variant") || !strings.Contains(logs, want) {
		t.Fatalf("no log line with %q:\n%s", want, logs)
	}
	if exe := pluginExe(t, e.Pid()); exe != variant {
		t.Fatalf("the engine's plugin runs %s, want %s", exe, variant)
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "backend plugin variant") {
			t.Log(l)
		}
	}
}

// pluginExe is the executable of the engine's one child process.
func pluginExe(t *testing.T, engine int) string {
	t.Helper()
	kids, err := enginetest.Children(engine)
	if err != nil || len(kids) != 1 {
		t.Fatalf("children of the engine: %v, %v", kids, err)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", kids[0]))
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestVariantSpeed measures prefill and decode tokens/s of llama plugin
// builds side by side, one engine at a time, in the order A B … B A
// (ROUNDS times), on one model:
//
//	HYDRA_VARIANT_SPEED=base=bin/hydra-plugin-cuda-llama,v4=bin/hydra-plugin-cuda-llama.x86-64-v4 \
//	HYDRA_VARIANT_SPEED_MODEL=bin/decode-cpu.gguf go test -run TestVariantSpeed -v ./host/pluginproc/
//
// HYDRA_VARIANT_SPEED_PROMPT (512) and _DECODE (128) are the token counts,
// _ROUNDS (2) the repetitions, _OPTS more --backend-opt k=v (comma-separated).
func TestVariantSpeed(t *testing.T) {
	spec := os.Getenv("HYDRA_VARIANT_SPEED")
	if spec == "" {
		t.Skip("HYDRA_VARIANT_SPEED=name=plugin,… and HYDRA_VARIANT_SPEED_MODEL=gguf measure plugin builds")
	}
	model := os.Getenv("HYDRA_VARIANT_SPEED_MODEL")
	prompt, decode, rounds := envInt(t, "HYDRA_VARIANT_SPEED_PROMPT", 512), envInt(t, "HYDRA_VARIANT_SPEED_DECODE", 128), envInt(t, "HYDRA_VARIANT_SPEED_ROUNDS", 2)
	type build struct{ name, path string }
	var builds []build
	for _, kv := range strings.Split(spec, ",") {
		name, path, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("HYDRA_VARIANT_SPEED: %q is not name=path", kv)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			t.Fatal(err)
		}
		builds = append(builds, build{name, abs})
	}
	bin := t.TempDir()
	if err := enginetest.Build(bin, enginetest.BuildOptions{Commands: []string{"hydra-engine"}}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--model", model, "--slots", "1", "--backend-opt", fmt.Sprintf("n_ctx=%d", prompt+decode+256)}
	if o := os.Getenv("HYDRA_VARIANT_SPEED_OPTS"); o != "" {
		for _, kv := range strings.Split(o, ",") {
			args = append(args, "--backend-opt", kv)
		}
	}
	var order []int
	for range rounds {
		for i := range builds {
			order = append(order, i)
		}
		for i := len(builds) - 1; i >= 0; i-- {
			order = append(order, i)
		}
	}
	pre, dec := make([][]float64, len(builds)), make([][]float64, len(builds))
	for run, i := range order {
		p, d := measureBuild(t, bin, builds[i].path, args, prompt, decode, run)
		pre[i], dec[i] = append(pre[i], p), append(dec[i], d)
		t.Logf("%-8s prefill %7.1f tok/s  decode %6.1f tok/s", builds[i].name, p, d)
	}
	for i, b := range builds {
		t.Logf("%-8s median prefill %7.1f tok/s, decode %6.1f tok/s over %d runs (%s)", b.name, median(pre[i]), median(dec[i]), len(pre[i]), b.path)
	}
}

// measureBuild starts an engine on plugin, prefills prompt tokens (ids that
// differ per run) and decodes n greedily, and returns both rates.
func measureBuild(t *testing.T, bin, plugin string, args []string, prompt, n, run int) (prefill, decode float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, err := enginetest.Start(ctx, enginetest.Config{Bin: bin, Backend: plugin, Args: args, WaitInfo: true, StartTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	c, err := transport.DialClient(ctx, e.TCP)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	toks := make([]byte, 0, 4*prompt)
	for i := range prompt {
		toks = binary.LittleEndian.AppendUint32(toks, uint32(300+(i*7919+run*104729)%20000))
	}
	start := time.Now()
	if resp, _, err := c.Call(ctx, transport.OpPrefill, "0", toks); err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("prefill: %v %v\n%s", resp, err, e.Logs)
	}
	prefill = float64(prompt) / time.Since(start).Seconds()
	start = time.Now()
	resp, body, err := c.Call(ctx, transport.OpDecode, "0", []byte(fmt.Sprintf(`{"n_predict":%d,"messages":null,"temperature":0,"ignore_eos":true}`, n)))
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("decode: %v %v\n%s", resp, err, e.Logs)
	}
	elapsed := time.Since(start).Seconds()
	frames, err := transport.ParseDecodeFrames(body)
	if err != nil {
		t.Fatal(err)
	}
	return prefill, float64(len(frames)) / elapsed
}

func envInt(t *testing.T, key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q is not a positive integer", key, v)
	}
	return n
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
