//go:build llama

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

// TestLlamaServerDraftMTP: llama-server's --spec-type draft-mtp on ours in
// llama-server mode, beside llama.cpp's llama-server from the same tree with
// the same flags and model (the nodes' hybrid architecture with its MTP
// block): both draft with the block (timings.draft_n) and generate every
// token asked for; on a model without the block ours refuses to start and
// says why.
func TestLlamaServerDraftMTP(t *testing.T) {
	c := withQwen3Tokenizer(t, gguf.TinyQwen35MoE())
	c.MTP = 1
	model := filepath.Join(t.TempDir(), "qwen35moe-mtp.gguf")
	if err := gguf.WriteFile(model, c); err != nil {
		t.Fatal(err)
	}
	llamaSetup(t)
	args := []string{"--model", model, "--parallel", "1", "--ctx-size", "2048", "--threads", "1", "--threads-batch", "1",
		"--spec-type", "draft-mtp", "--spec-draft-n-max", "4"}
	op := freePort(t)
	startLlamaServer(t, op, append([]string{"--host", "127.0.0.1", "--port", fmt.Sprint(op), "--spec-draft-rule", "always"}, args...))
	urls := map[string]string{"ours": fmt.Sprintf("http://127.0.0.1:%d/completion", op)}
	if ref, err := filepath.Abs(filepath.Join("..", "bin", "llama-server", "llama-server")); err == nil {
		if _, err := os.Stat(ref); err == nil {
			rp := freePort(t)
			startReference(t, ref, rp, args)
			urls["llama-server"] = fmt.Sprintf("http://127.0.0.1:%d/completion", rp)
		}
	}
	body := `{"prompt":"Write a short note about moving state between engines.","n_predict":32,"temperature":0}`
	for name, url := range urls {
		tm := completionTimings(t, url, body)
		t.Logf("%s: %d tokens, %d draft tokens verified", name, tm.PredictedN, tm.DraftN)
		if tm.PredictedN != 32 || tm.DraftN == 0 {
			t.Errorf("%s: %d tokens and %d draft tokens, want 32 and drafts", name, tm.PredictedN, tm.DraftN)
		}
	}

	// A model without the block: refused at start, saying why.
	plain := filepath.Join(t.TempDir(), "qwen35moe.gguf")
	if err := gguf.WriteFile(plain, withQwen3Tokenizer(t, gguf.TinyQwen35MoE())); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "hydra-engine"), "llama-server", "--model", plain,
		"--port", fmt.Sprint(freePort(t)), "--spec-type", "draft-mtp").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no multi-token-prediction block") {
		t.Errorf("draft-mtp on a model without the block: %v\n%s", err, out)
	}
}
