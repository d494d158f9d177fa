package cudallama

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The pure-Go parts: they build and run without llama.cpp too.

func TestParseOptions(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil || o.nCtx != DefaultNCtx || o.flashAttn != FlashOn || o.nGPULayers != -1 || o.nThreadsBatch != o.nThreads ||
		o.cacheTypeK != "f16" || !o.mmap || o.eagerLogits {
		t.Fatalf("defaults %+v, %v", o, err)
	}
	for v, want := range map[string]bool{"lazy": false, "Eager": true, " LAZY ": false} {
		if o, err := parseOptions(map[string]string{OptRestoreLogits: v}); err != nil || o.eagerLogits != want {
			t.Fatalf("restore_logits=%q: eager %v, %v", v, o.eagerLogits, err)
		}
	}
	o, err = parseOptions(map[string]string{OptNCtx: " 8192 ", OptFlashAttn: "off", OptNThreads: "3", OptNGPULayers: "0",
		OptCacheTypeK: "Q8_0", OptAlias: "m", OptLibDir: "/opt/lib", OptMmap: "false", OptNBatch: "512", OptNUBatch: "128"})
	if err != nil || o.nCtx != 8192 || o.flashAttn != FlashOff || o.nThreads != 3 || o.nThreadsBatch != 3 || o.nGPULayers != 0 ||
		o.cacheTypeK != "q8_0" || o.alias != "m" || o.libDir != "/opt/lib" || o.mmap || o.nBatch != 512 || o.nUBatch != 128 {
		t.Fatalf("parsed %+v, %v", o, err)
	}
	for _, tc := range []struct {
		opts map[string]string
		msg  string
	}{
		{map[string]string{"nctx": "1"}, `unknown option "nctx"`},
		{map[string]string{OptNCtx: "0"}, "out of range"},
		{map[string]string{OptNCtx: "lots"}, "not an integer"},
		{map[string]string{OptFlashAttn: "maybe"}, "on, off or auto"},
		{map[string]string{OptCacheTypeV: "q2_k"}, "want one of"},
		{map[string]string{OptCacheTypeV: "q4_0", OptFlashAttn: "off"}, "needs flash attention"},
		{map[string]string{OptAlias: " "}, "must not be empty"},
		{map[string]string{OptMmap: "perhaps"}, "not a boolean"},
		{map[string]string{OptNGPULayers: "-2"}, "out of range"},
		{map[string]string{OptRestoreLogits: "later"}, "lazy or eager"},
	} {
		_, err := parseOptions(tc.opts)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want ErrBadRequest mentioning %q", tc.opts, err, tc.msg)
		}
	}
}

// A settled experiment switch is refused as removed, whatever its value,
// not taken for a typo nor ignored; the unknown-option list leaves it out.
func TestRemovedOptions(t *testing.T) {
	for _, key := range []string{"pin_ring", "copy_threads", "stream_restore", "cuda_sync", "restore_in_place"} {
		_, err := parseOptions(map[string]string{key: "true", OptNCtx: "1024"})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), fmt.Sprintf("option %q was removed", key)) {
			t.Errorf("%s: %v, want ErrBadRequest saying it was removed", key, err)
		}
	}
	_, err := parseOptions(map[string]string{"nctx": "1"})
	for key := range removedOptions {
		if strings.Contains(err.Error(), key) {
			t.Errorf("the known options name %s: %v", key, err)
		}
	}
}

// The pin (mk/llama-pin.mk) is one well-formed line, and a plugin built
// with llama.cpp was built from the commit it names: the streaming shim
// uses llama.cpp internals, and libggml-cuda.so must match.
func TestVersionPin(t *testing.T) {
	pin := readPin(t)
	if !regexp.MustCompile(`^node-llama-cpp@\d+\.\d+\.\d+$`).MatchString(pin.pkg) || !strings.HasPrefix(pin.integrity, "sha512-") ||
		!regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(pin.commit) {
		t.Fatalf("mk/llama-pin.mk: LLAMA_PIN %+v is not PACKAGE@VERSION sha512-… COMMIT (40 hex digits)", pin)
	}
	if Linked && llamaCommit != pin.commit {
		t.Fatalf("built from llama.cpp %s, mk/llama-pin.mk pins %s: rebuild through make (make build-llama, make test-llama)", llamaCommit, pin.commit)
	}
	if Linked && backendVersion() != Version+"+llama.cpp-"+pin.commit[:8] {
		t.Fatalf("backend version %q does not name the pinned commit %s", backendVersion(), pin.commit)
	}
}

type llamaPin struct{ pkg, integrity, commit string }

// readPin reads LLAMA_PIN from mk/llama-pin.mk.
func readPin(t *testing.T) llamaPin {
	t.Helper()
	mk, err := os.ReadFile("../../mk/llama-pin.mk")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LLAMA_PIN := (\S+) (\S+) (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("mk/llama-pin.mk has no line LLAMA_PIN := PACKAGE@VERSION INTEGRITY COMMIT")
	}
	return llamaPin{string(m[1]), string(m[2]), string(m[3])}
}

func TestCUDALibraryLookup(t *testing.T) {
	dir := t.TempDir()
	if _, err := cudaLibrary(dir); !errors.Is(err, errNoCUDALibrary) {
		t.Fatalf("no library: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, CUDALibrary), []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cudaLibrary(dir); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "no version stamp") {
		t.Fatalf("no stamp: %v", err)
	}
	stamp := filepath.Join(dir, VersionStampFile)
	if err := os.WriteFile(stamp, []byte(versionStamp("v0.0.1")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cudaLibrary(dir); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "v0.0.1") {
		t.Fatalf("other version: %v", err)
	}
	if err := os.WriteFile(stamp, []byte(versionStamp(llamaCommit)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if lib, err := cudaLibrary(dir); err != nil || lib != filepath.Join(dir, CUDALibrary) {
		t.Fatalf("matching stamp: %q, %v", lib, err)
	}
}

// head builds a state head: one stream, cells with the given positions.
func head(streams uint32, pos ...int32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, streams)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pos)))
	for _, p := range pos {
		b = binary.LittleEndian.AppendUint32(b, uint32(p))
		b = binary.LittleEndian.AppendUint32(b, 1)
		b = binary.LittleEndian.AppendUint32(b, 3)
	}
	return b
}

func TestReadStateHead(t *testing.T) {
	layout := plainLayout(100, 50, 0)
	toks := []int32{1, 2, 3}
	h, err := readStateHead(bytes.NewReader(head(1, 2, 0, 1)), toks, 10, 8, layout, layout.size(3))
	if err != nil || h.cells != 3 || !bytes.Equal(h.raw, head(1, 2, 0, 1)) {
		t.Fatalf("good head: %+v, %v", h, err)
	}
	h, err = readStateHead(bytes.NewReader(head(1)), nil, 10, 8, layout, emptyState)
	if err != nil || h.cells != 0 || len(h.raw) != emptyState {
		t.Fatalf("empty state: %+v, %v", h, err)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		toks []int32
		size int64
		msg  string
	}{
		{"streams", head(2, 0, 1, 2), toks, 0, "2 KV streams"},
		{"fewer tokens", head(1, 0, 1, 2), toks[:2], 0, "3 cells, the blob header 2 tokens"},
		{"over n_ctx", head(1, 0, 1, 2, 3, 4, 5, 6, 7, 8), make([]int32, 9), 0, "n_ctx is 8"},
		{"token range", head(1, 0, 1, 2), []int32{1, 10, 3}, 0, "token 10 at position 1"},
		{"size", head(1, 0, 1, 2), toks, layout.size(3) - 1, "needs 250"},
		{"position range", head(1, 0, 3, 1), toks, 0, "cell 1: position 3 outside [0, 3)"},
		{"negative position", head(1, 0, -1, 1), toks, 0, "position -1"},
		{"repeat", head(1, 0, 1, 1), toks, 0, "cell 2: position 1 repeated"},
		{"seq ids", func() []byte { b := head(1, 0, 1, 2); b[8+12+4] = 2; return b }(), toks, 0, "cell 1 belongs to 2 sequences"},
		{"truncated", head(1, 0, 1, 2)[:20], toks, 0, "truncated at offset 20"},
		{"truncated header", []byte{1, 0}, toks, 0, "truncated at offset 2"},
	} {
		size := tc.size
		if size == 0 {
			size = 1 << 20
		}
		_, err := readStateHead(bytes.NewReader(tc.in), tc.toks, 10, 8, layout, size)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrBadRequest mentioning %q", tc.name, err, tc.msg)
		}
	}
	boom := errors.New("reset")
	_, err = readStateHead(io.MultiReader(bytes.NewReader(head(1, 0)[:12]), errReader{boom}), []int32{1}, 10, 8, layout, 1<<20)
	if !errors.Is(err, boom) || errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("reader error: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestUniform(t *testing.T) {
	// The draw is a function of seed and position only.
	if uniform(7, 100) != uniform(7, 100) || uniform(7, 100) == uniform(8, 100) || uniform(7, 100) == uniform(7, 101) {
		t.Fatal("uniform")
	}
	for pos := range 1000 {
		if u := uniform(1, pos); u < 0 || u >= 1 {
			t.Fatalf("uniform %v", u)
		}
	}
}

func TestPlacementOptions(t *testing.T) {
	o, err := parseOptions(map[string]string{OptNCPUMoE: "2",
		OptOverrideTensor: `token_embd\.weight=CPU, output\.weight=CUDA0,(?=x)=y=CPU`})
	if err != nil {
		t.Fatal(err)
	}
	want := []placementRule{{`token_embd\.weight`, "CPU"}, {`output\.weight`, "CUDA0"}, {`(?=x)=y`, "CPU"},
		{`blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps`, "CPU"}, {`blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps`, "CPU"}}
	if got := o.rules(); !slices.Equal(got, want) {
		t.Fatalf("rules %v, want %v", got, want)
	}
	if o, err := parseOptions(nil); err != nil || len(o.rules()) != 0 {
		t.Fatalf("no placement: %v, %v", o.rules(), err)
	}
	for _, tc := range []struct {
		v, msg string
	}{
		{"CPU", `"CPU" is not PATTERN=DEVICE`},
		{"=CPU", `"=CPU" is not PATTERN=DEVICE`},
		{`blk\.0=`, `is not PATTERN=DEVICE`},
		{`a=CPU,,b=CPU`, `"" is not PATTERN=DEVICE`},
	} {
		_, err := parseOptions(map[string]string{OptOverrideTensor: tc.v})
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("override_tensor=%q: %v, want %q", tc.v, err, tc.msg)
		}
	}
	if _, err := parseOptions(map[string]string{OptNCPUMoE: "-1"}); !errors.Is(err, iface.ErrBadRequest) {
		t.Errorf("n_cpu_moe=-1: %v", err)
	}
}

// The n_cpu_moe pattern is llama.cpp's: a layer's experts, not another
// layer's, not the router, not a dense FFN.
func TestExpertsPattern(t *testing.T) {
	re := regexp.MustCompile(expertsPattern(1)) // the same in RE2 and ECMAScript
	for name, want := range map[string]bool{
		"blk.1.ffn_up_exps.weight": true, "blk.1.ffn_down_exps.weight": true, "blk.1.ffn_gate_exps.weight": true,
		"blk.1.ffn_gate_up_exps.weight": true, "blk.1.ffn_up_chexps.weight": true,
		"blk.10.ffn_up_exps.weight": false, "blk.11.ffn_up_exps.weight": false, "blk.1.ffn_gate_inp.weight": false,
		"blk.1.ffn_up.weight": false, "blk.0.ffn_up_exps.weight": false,
	} {
		if re.MatchString(name) != want {
			t.Errorf("%s: match %v, want %v", name, !want, want)
		}
	}
}

func TestGPULayersAndRope(t *testing.T) {
	for v, want := range map[string]int{"all": -1, "ALL": -1, "-1": -1, "0": 0, "33": 33} {
		if o, err := parseOptions(map[string]string{OptNGPULayers: v}); err != nil || o.nGPULayers != want {
			t.Errorf("n_gpu_layers=%s: %d, %v", v, o.nGPULayers, err)
		}
	}
	if _, err := parseOptions(map[string]string{OptNGPULayers: "most"}); err == nil || !strings.Contains(err.Error(), "not an integer (or all)") {
		t.Errorf("n_gpu_layers=most: %v", err)
	}
	o, err := parseOptions(nil)
	if err != nil || o.ropeScaling != ropeUnspecified || o.ropeFreqScale != 0 || o.yarnOrigCtx != 0 {
		t.Fatalf("rope defaults %+v, %v", o.ropeOptions, err)
	}
	o, err = parseOptions(map[string]string{OptRopeScaling: "YaRN", OptRopeScale: "5", OptYarnOrigCtx: "32768"})
	if err != nil || o.ropeScaling != ropeYaRN || o.ropeFreqScale != 0.2 || o.yarnOrigCtx != 32768 {
		t.Fatalf("rope %+v, %v", o.ropeOptions, err)
	}
	for k, v := range map[string]string{OptRopeScaling: "ntk", OptRopeScale: "0", OptYarnOrigCtx: "-1"} {
		if _, err := parseOptions(map[string]string{k: v}); !errors.Is(err, iface.ErrBadRequest) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
	if _, err := parseOptions(map[string]string{OptRopeScale: "inf"}); err == nil {
		t.Error("rope_scale=inf accepted")
	}
}

// TestBooleanOptionsAlike: every boolean option takes the same forms
// (strconv's and on/off), as flash_attn takes on/off.
func TestBooleanOptionsAlike(t *testing.T) {
	for _, c := range []struct {
		key  string
		get  func(options) bool
		flip bool // the field is the option's negation
	}{
		{OptKVUnified, func(o options) bool { return o.kvSplit }, true},
		{OptContextShift, func(o options) bool { return o.contextShift }, false},
		{OptSWAFull, func(o options) bool { return o.swaFull }, false},
		{OptMmap, func(o options) bool { return o.mmap }, false},
	} {
		for v, want := range map[string]bool{"on": true, "ON": true, "off": false, "true": true, "0": false, "1": true, "False": false} {
			o, err := parseOptions(map[string]string{c.key: v})
			if err != nil || c.get(o) != (want != c.flip) {
				t.Errorf("%s=%s: %v, %v", c.key, v, c.get(o) != c.flip, err)
			}
		}
		if _, err := parseOptions(map[string]string{c.key: "perhaps"}); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "on/off") {
			t.Errorf("%s=perhaps: %v", c.key, err)
		}
	}
}
