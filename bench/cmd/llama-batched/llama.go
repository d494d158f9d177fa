//go:build llama && cgo

package main

// The binding of llama-batched over llama.h and ggml-backend.h. The include
// paths into the llama plugin's tree (mk/llama-pin.mk) and its static
// libraries come from CGO_CPPFLAGS and CGO_LDFLAGS (the Makefile's LLAMA_ENV,
// as for the plugin), so the ceiling runs the llama.cpp the plugin runs.

/*
#cgo CXXFLAGS: -std=c++17
#include <stdio.h>
#include <stdlib.h>
#include "ggml-backend.h"
#include "hydra-llama-commit.h"
#include "llama.h"

// llama.cpp's log on stderr: warnings and errors, or everything when verbose.
// A continuation line (GGML_LOG_LEVEL_CONT) keeps its line's level.
static int bench_verbose;
static enum ggml_log_level bench_last_level = GGML_LOG_LEVEL_INFO;
static void bench_log(enum ggml_log_level level, const char * text, void * user) {
	(void) user;
	if (level != GGML_LOG_LEVEL_CONT) {
		bench_last_level = level;
	}
	if (bench_verbose || bench_last_level >= GGML_LOG_LEVEL_WARN) {
		fputs(text, stderr);
	}
}
static void bench_log_install(int verbose) {
	bench_verbose = verbose;
	llama_log_set(bench_log, NULL);
}

// The fields a batch entry sets; the rest stay as llama_batch_init left them.
static void bench_batch_set(struct llama_batch * b, int i, llama_token tok, llama_pos pos, llama_seq_id seq, int logits) {
	b->token[i] = tok;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = (int8_t) logits;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

const (
	llamaModule      = "llama.cpp"
	cudaLibrary      = "libggml-cuda.so"
	versionStampFile = "hydra-ggml.version" // written by make cuda beside the library
)

// llama is a loaded model, and its context once makeContext made it.
type llama struct {
	cfg    config
	model  *C.struct_llama_model
	vocab  *C.struct_llama_vocab
	ctx    *C.struct_llama_context
	batch  C.struct_llama_batch
	nBatch int
	nVocab int
	info   setupInfo
}

func openBackend(cfg config, notes io.Writer) (backend, error) {
	C.bench_log_install(C.int(boolInt(cfg.verbose)))
	C.llama_backend_init()
	gpu, lib := loadGPU(cfg.libDir, notes)
	mp := C.llama_model_default_params()
	ngl := 0
	if gpu != "" {
		ngl = cfg.ngl
		if ngl < 0 {
			ngl = math.MaxInt32
		}
	}
	mp.n_gpu_layers = C.int32_t(ngl)
	m, err := loadModel(cfg.model, mp)
	if err != nil {
		return nil, err
	}
	l := &llama{cfg: cfg, model: m, vocab: C.llama_model_get_vocab(m)}
	l.nVocab = int(C.llama_vocab_n_tokens(l.vocab))
	var desc [256]C.char
	C.llama_model_desc(m, &desc[0], C.size_t(len(desc)))
	device := "CPU"
	if gpu != "" {
		device = gpu
	}
	l.info = setupInfo{
		Model: filepath.Base(cfg.model), ModelDesc: C.GoString(&desc[0]),
		ModelBytes: uint64(C.llama_model_size(m)), NParams: uint64(C.llama_model_n_params(m)),
		NVocab: l.nVocab, BOS: int32(C.llama_vocab_bos(l.vocab)), Device: device, GPULib: lib, NGPULayers: ngl,
		Threads: cfg.threads, FlashAttn: cfg.flashAttn, KVUnified: cfg.kvUnified,
		Llama:  llamaModule + " " + llamaVersion(),
		System: strings.TrimSpace(C.GoString(C.llama_print_system_info())),
	}
	return l, nil
}

// tokenizeOnly loads the vocabulary alone and tokenizes each text.
func tokenizeOnly(cfg config, texts []string) ([][]int32, error) {
	C.bench_log_install(C.int(boolInt(cfg.verbose)))
	C.llama_backend_init()
	mp := C.llama_model_default_params()
	mp.vocab_only = true
	m, err := loadModel(cfg.model, mp)
	if err != nil {
		return nil, err
	}
	defer C.llama_model_free(m)
	vocab := C.llama_model_get_vocab(m)
	out := make([][]int32, len(texts))
	for i, t := range texts {
		if out[i], err = tokenize(vocab, t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func loadModel(path string, mp C.struct_llama_model_params) (*C.struct_llama_model, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	m := C.llama_model_load_from_file(cs, mp)
	if m == nil {
		return nil, fmt.Errorf("llama.cpp could not load %s (see its log above)", path)
	}
	return m, nil
}

// loadGPU registers libggml-cuda.so when it is present and stamped with
// this binary's llama.cpp version (a library from other sources would
// corrupt memory rather than fail), and returns the first GPU's name, or ""
// for the CPU. Only that library is loaded: ggml_backend_load_all would
// register a second CPU backend beside the one linked in.
func loadGPU(dir string, notes io.Writer) (name, lib string) {
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", ""
		}
		dir = filepath.Dir(exe)
	}
	lib = filepath.Join(dir, cudaLibrary)
	if _, err := os.Stat(lib); err != nil {
		fmt.Fprintf(notes, "running on CPU: no %s in %s\n", cudaLibrary, dir)
		return "", ""
	}
	want := llamaModule + " " + llamaVersion()
	stamp, err := os.ReadFile(filepath.Join(dir, versionStampFile))
	if got := strings.TrimSpace(string(stamp)); err != nil || got != want {
		fmt.Fprintf(notes, "running on CPU: %s is stamped %q, this binary is %q (make cuda stamps it)\n", lib, got, want)
		return "", ""
	}
	cs := C.CString(lib)
	defer C.free(unsafe.Pointer(cs))
	if C.ggml_backend_load(cs) == nil {
		fmt.Fprintf(notes, "running on CPU: ggml could not load %s\n", lib)
		return "", ""
	}
	for i := C.size_t(0); i < C.ggml_backend_dev_count(); i++ {
		d := C.ggml_backend_dev_get(i)
		switch C.ggml_backend_dev_type(d) {
		case C.GGML_BACKEND_DEVICE_TYPE_GPU, C.GGML_BACKEND_DEVICE_TYPE_IGPU:
			return C.GoString(C.ggml_backend_dev_name(d)) + " (" + C.GoString(C.ggml_backend_dev_description(d)) + ")", lib
		}
	}
	fmt.Fprintf(notes, "running on CPU: %s sees no GPU\n", lib)
	return "", lib
}

// llamaVersion is the llama.cpp commit compiled in, as make cuda stamps
// the library built from the same tree.
func llamaVersion() string { return C.HYDRA_LLAMA_COMMIT }

func (l *llama) setup() setupInfo { return l.info }

func (l *llama) tokenize(text string) ([]int32, error) { return tokenize(l.vocab, text) }

// tokenize adds BOS where the model asks for it and parses special tokens,
// as Ollama's llamarunner does for a prompt's first part.
func tokenize(vocab *C.struct_llama_vocab, text string) ([]int32, error) {
	cs := C.CString(text)
	defer C.free(unsafe.Pointer(cs))
	toks := make([]int32, len(text)+8)
	for {
		n := C.llama_tokenize(vocab, cs, C.int32_t(len(text)), (*C.llama_token)(unsafe.Pointer(&toks[0])),
			C.int32_t(len(toks)), true, true)
		if n >= 0 {
			return toks[:n], nil
		}
		if n == C.INT32_MIN || int(-n) <= len(toks) {
			return nil, errors.New("tokenizing the prompt failed")
		}
		toks = make([]int32, -n)
	}
}

func (l *llama) makeContext(nCtx, nSeqMax int) error {
	cp := C.llama_context_default_params()
	cp.n_ctx = C.uint32_t(nCtx)
	cp.n_batch = C.uint32_t(l.cfg.nBatch)
	cp.n_ubatch = C.uint32_t(min(l.cfg.nUBatch, l.cfg.nBatch))
	cp.n_seq_max = C.uint32_t(nSeqMax)
	cp.n_threads = C.int32_t(l.cfg.threads)
	cp.n_threads_batch = C.int32_t(l.cfg.threads)
	cp.flash_attn_type = flashAttnType(l.cfg.flashAttn)
	cp.kv_unified = C.bool(l.cfg.kvUnified)
	cp.no_perf = true
	l.ctx = C.llama_init_from_model(l.model, cp)
	if l.ctx == nil {
		return errors.New("llama.cpp could not create a context (see its log above)")
	}
	l.nBatch = int(cp.n_batch)
	l.batch = C.llama_batch_init(C.int32_t(l.nBatch), 0, 1)
	l.info.NCtx, l.info.NSeqMax = int(C.llama_n_ctx(l.ctx)), nSeqMax
	l.info.NBatch, l.info.NUBatch = int(cp.n_batch), int(cp.n_ubatch)
	return nil
}

func flashAttnType(s string) C.enum_llama_flash_attn_type {
	switch s {
	case "off":
		return C.LLAMA_FLASH_ATTN_TYPE_DISABLED
	case "auto":
		return C.LLAMA_FLASH_ATTN_TYPE_AUTO
	}
	return C.LLAMA_FLASH_ATTN_TYPE_ENABLED
}

func (l *llama) batchAdd(tok int32, pos, seq int, logits bool) {
	i := int(l.batch.n_tokens)
	C.bench_batch_set(&l.batch, C.int(i), C.llama_token(tok), C.llama_pos(pos), C.llama_seq_id(seq), C.int(boolInt(logits)))
	l.batch.n_tokens++
}

func (l *llama) batchLen() int { return int(l.batch.n_tokens) }

func (l *llama) decode() error {
	r := C.llama_decode(l.ctx, l.batch)
	l.batch.n_tokens = 0
	switch r {
	case 0:
		return nil
	case 1:
		return errors.New("llama_decode: no KV cells left for the batch (raise -c)")
	}
	return fmt.Errorf("llama_decode failed (%d)", int(r))
}

// argmax is greedy sampling: the row's largest logit, the lowest id on a tie.
func (l *llama) argmax(i int) int32 {
	p := C.llama_get_logits_ith(l.ctx, C.int32_t(i))
	logits := unsafe.Slice((*float32)(unsafe.Pointer(p)), l.nVocab)
	best := 0
	for j, v := range logits {
		if v > logits[best] {
			best = j
		}
	}
	return int32(best)
}

func (l *llama) isEOG(tok int32) bool { return bool(C.llama_vocab_is_eog(l.vocab, C.llama_token(tok))) }

func (l *llama) clear() {
	if l.ctx != nil {
		C.llama_memory_clear(C.llama_get_memory(l.ctx), true)
	}
}

// close frees the batch and the model. The context is never freed: with
// this llama.cpp, llama_free of a CUDA context crashes (the scheduler resets
// backends the context already destroyed), and the process ends next.
func (l *llama) close() {
	if l.ctx != nil {
		C.llama_batch_free(l.batch)
		return
	}
	C.llama_model_free(l.model)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
