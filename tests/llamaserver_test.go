//go:build llama

package tests

// `hydra-engine llama-server` end to end: the engine started as a Hydra
// node agent starts it, with the global and per-node parameters of real
// node configurations, on the llama plugin and a generated MoE model in
// place of the 35B one (docs/llama-server.md).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/transport"
)

// chatTemplate is the node's --chat-template-file: ChatML, in Jinja.
const chatTemplate = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}" +
	"{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"

// llamaServerFiles writes the model (gguf.TinyMoE at Q8_0), the chat
// template and a router presets file.
func llamaServerFiles(t *testing.T) (model, template, presets string) {
	t.Helper()
	dir := t.TempDir()
	c := gguf.TinyMoE()
	c.Type = gguf.WeightQ8_0
	model, template, presets = filepath.Join(dir, "moe.gguf"), filepath.Join(dir, "chat.jinja"), filepath.Join(dir, "preset.ini")
	if err := gguf.WriteFile(model, c); err != nil {
		t.Fatal(err)
	}
	for path, text := range map[string]string{template: chatTemplate,
		presets: "[*]\nctx-size = 2048\n[tiny-moe]\nmodel = " + model + "\nn-cpu-moe = 2\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return model, template, presets
}

// nodeLine is the node agent's command line: --host, --port, --rpc-port,
// then --KEY VALUE with a true boolean bare; the 35B model's n-cpu-moe 8 is
// 2 on the tiny model's 4 layers, its ctx-size 320000 is 2048.
func nodeLine(httpPort, rpcPort int, model, template, presets string) []string {
	return []string{
		"--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--rpc-port", fmt.Sprint(rpcPort),
		// global
		"--flash-attn", "on", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--kv-unified", "--cont-batching",
		"--cache-prompt", "--cache-reuse", "64", "--prio", "3", "--prio-batch", "1", "--rope-scaling", "yarn",
		"--rope-scale", "5", "--yarn-orig-ctx", "32768", "--reasoning", "on", "--jinja", "--timeout", "1800",
		"--chat-template-kwargs", `{"preserve_thinking": true}`, "--log-prefix", "false", "--metrics", "--slots",
		"--perf", "--log-verbosity", "4", "--context-shift",
		// per node
		"--model", model, "--chat-template-file", template, "--n-cpu-moe", "2", "--n-gpu-layers", "all",
		"--override-tensor", `token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU`,
		"--ctx-size", "2048", "--parallel", "2", "--temp", "0.86", "--repeat-penalty", "1.06", "--top-k", "20",
		"--top-p", "0.95", "--slot-prompt-similarity", "0.4",
		// router mode
		"--models-preset", presets, "--models-max", "1",
		// the test machine's: one thread each, beside the other tests
		"--threads", "1", "--threads-batch", "1",
	}
}

// startLlamaServer runs hydra-engine llama-server with args until /health
// answers 200, and stops it (SIGTERM, exit 0 expected) when the test ends.
func startLlamaServer(t *testing.T, httpPort int, args []string) *enginetest.Log {
	t.Helper()
	logs := enginetest.NewLog(0)
	cmd := exec.Command(filepath.Join(binDir, "hydra-engine"), append([]string{"llama-server"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Env = append(os.Environ(), "HYDRA_SHUTDOWN_GRACE=5s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("engine exit: %v\n%s", err, logs)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("engine did not stop on SIGTERM\n%s", logs)
		}
		if t.Failed() {
			t.Logf("ENGINE LOG\n%s", logs)
		}
	})
	health := fmt.Sprintf("http://127.0.0.1:%d/health", httpPort)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(health); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return logs
			}
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("engine exited during start: %v\n%s", err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not healthy after 90s\n%s", logs)
		}
	}
}

func TestLlamaServerCommandLine(t *testing.T) {
	llamaSetup(t) // the plugin beside the engine, where llama-server mode looks for cuda-llama
	model, template, presets := llamaServerFiles(t)
	httpPort, rpcPort := freePort(t), freePort(t)
	logs := startLlamaServer(t, httpPort, nodeLine(httpPort, rpcPort, model, template, presets))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)

	// HTTP on --host/--port, Hydra RPC on --rpc-port: both serve the model.
	var health map[string]any
	httpJSON(t, "GET", base+"/health", "", 200, &health)
	if health["status"] != "ok" {
		t.Errorf("/health %v", health)
	}
	m, _ := mustOK(t, client(t, fmt.Sprintf("tcp://127.0.0.1:%d", rpcPort)), transport.OpInfo, "0", nil)
	if num(t, m, "n_slots") != 2 || num(t, m, "n_ctx") != 2048 || m["backend"] != "cuda-llama" {
		t.Errorf("INFO %v", m)
	}
	checkLlamaServerSlots(t, base)
	checkLlamaServerLog(t, logs.String(), httpPort, rpcPort)

	// A completion runs with the sampling defaults (temp 0.86: not checked
	// token by token).
	code, body, _ := httpDo(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}`)
	if code != 200 || !strings.Contains(string(body), `"choices"`) {
		t.Errorf("chat completion: %d %s", code, body)
	}

	// The sampler defaults are the engine's: INFO shows them.
	if sp, _ := m["sampler"].(map[string]any); sp["temperature"] != 0.86 || sp["top_k"] != float64(20) ||
		sp["top_p"] != 0.95 || sp["repeat_penalty"] != 1.06 {
		t.Errorf("INFO sampler %v", m["sampler"])
	}
	if m["kv_unified"] != true || num(t, m, "n_ctx_slot") != 2048 {
		t.Errorf("--kv-unified: INFO %v", m)
	}
	checkTemplateFile(t, base)
	checkPresets(t, base, rpcPort)
	checkSplitAndShift(t, model, template)
}

// checkPresets: a completion naming the preset's alias loads it (the slots
// emptied, the reply saying so, the identity changed everywhere); a PREFILL
// naming the first model's alias loads that back; an unknown alias stays.
func checkPresets(t *testing.T, base string, rpcPort int) {
	t.Helper()
	c := client(t, fmt.Sprintf("tcp://127.0.0.1:%d", rpcPort))
	first, _ := mustOK(t, c, transport.OpInfo, "0", nil)
	mustOK(t, c, transport.OpPrefill, "1", chat("held in slot 1"))
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	httpJSON(t, "GET", base+"/v1/models", "", 200, &models)
	if len(models.Data) != 2 || models.Data[0].ID != first["model_alias"] || models.Data[1].ID != "tiny-moe" {
		t.Fatalf("/v1/models %+v", models)
	}
	code, body, resp := httpDo(t, "POST", base+"/v1/chat/completions", `{"model":"tiny-moe","messages":[{"role":"user","content":"Hi"}],"max_tokens":2}`)
	var r struct {
		Model         string `json:"model"`
		ModelSwitched bool   `json:"model_switched"`
	}
	if code != 200 || json.Unmarshal(body, &r) != nil || r.Model != "tiny-moe" || !r.ModelSwitched || resp.Header.Get("X-Hydra-Model-Switched") != "true" {
		t.Fatalf("completion naming the preset: %d %s", code, body)
	}
	c = client(t, fmt.Sprintf("tcp://127.0.0.1:%d", rpcPort)) // the first connection's plugin is gone
	info, _ := mustOK(t, c, transport.OpInfo, "0", nil)
	meta, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	if info["model_alias"] != "tiny-moe" || num(t, meta, "n_past") != 0 {
		t.Errorf("after the switch: INFO alias %v, slot 1 n_past %v", info["model_alias"], meta["n_past"])
	}
	back, _ := mustOK(t, c, transport.OpPrefill, "0", []byte(fmt.Sprintf(`{"messages":[{"role":"user","content":"x"}],"model":%q}`, first["model_alias"])))
	if back["model_switched"] != true || back["model_alias"] != first["model_alias"] {
		t.Errorf("PREFILL naming the first model: %v", back)
	}
	stay, _ := mustOK(t, c, transport.OpPrefill, "0", []byte(`{"messages":[{"role":"user","content":"x"}],"model":"no-such-model"}`))
	if stay["model_switched"] == true || stay["model_fallback"] != true {
		t.Errorf("PREFILL naming an unknown model: %v", stay)
	}
}

// checkTemplateFile: a chat completion's prompt is the template file's
// rendering: as many prompt tokens as that text sent as a raw prompt.
func checkTemplateFile(t *testing.T, base string) {
	t.Helper()
	var chat, text struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi there"}],"max_tokens":1}`, 200, &chat)
	rendered, _ := json.Marshal("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")
	httpJSON(t, "POST", base+"/v1/completions", `{"prompt":`+string(rendered)+`,"max_tokens":1}`, 200, &text)
	if chat.Usage.PromptTokens == 0 || chat.Usage.PromptTokens != text.Usage.PromptTokens {
		t.Errorf("chat prompt %d tokens, the template file's rendering %d", chat.Usage.PromptTokens, text.Usage.PromptTokens)
	}
}

// checkSplitAndShift: a second engine without --kv-unified gives each slot
// an equal share of --ctx-size, refusing a prompt longer than a share, and
// with --context-shift decodes past a full share instead of stopping.
func checkSplitAndShift(t *testing.T, model, template string) {
	t.Helper()
	httpPort, rpcPort := freePort(t), freePort(t)
	startLlamaServer(t, httpPort, []string{"--host", "127.0.0.1", "--port", fmt.Sprint(httpPort), "--rpc-port", fmt.Sprint(rpcPort),
		"--model", model, "--chat-template-file", template, "--jinja", "--ctx-size", "512", "--parallel", "2",
		"--context-shift", "--threads", "1", "--threads-batch", "1"})
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	ids := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprint(10 + i%200)
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
	code, body, _ := httpDo(t, "POST", base+"/v1/completions", `{"prompt":`+ids(300)+`,"max_tokens":1}`)
	if code != 400 || !strings.Contains(string(body), "a slot holds 256 (n_ctx 512 split across 2 slots)") {
		t.Errorf("a prompt over a slot's share: %d %s", code, body)
	}
	var r struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Choices []struct {
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	httpJSON(t, "POST", base+"/v1/completions", `{"prompt":`+ids(200)+`,"max_tokens":120,"ignore_eos":true,"temperature":0}`, 200, &r)
	if r.Usage.CompletionTokens != 120 || r.Choices[0].FinishReason != "length" {
		t.Errorf("a decode past a slot's share with --context-shift: %d tokens, %+v", r.Usage.CompletionTokens, r.Choices)
	}
}

// checkLlamaServerSlots: GET /slots is llama-server's JSON array, one
// object per --parallel slot.
func checkLlamaServerSlots(t *testing.T, base string) {
	t.Helper()
	var slots []map[string]any
	httpJSON(t, "GET", base+"/slots", "", 200, &slots)
	if len(slots) != 2 {
		t.Fatalf("/slots: %d slots, want 2", len(slots))
	}
	for i, s := range slots {
		for _, k := range []string{"id", "is_processing", "n_past", "n_ctx"} {
			if _, ok := s[k]; !ok {
				t.Errorf("/slots[%d] has no %s: %v", i, k, s)
			}
		}
		next, _ := s["next_token"].([]any)
		if len(next) != 1 {
			t.Fatalf("/slots[%d].next_token: %v", i, s["next_token"])
		}
		if _, ok := next[0].(map[string]any)["n_remain"]; !ok || s["id"] != float64(i) {
			t.Errorf("/slots[%d]: %v", i, s)
		}
	}
}

// checkLlamaServerLog: one line for each parameter without effect, the
// placement and sampler defaults asked for, the plugin's report of where
// each rule put the weights (debug, from --log-verbosity 4), the listeners.
func checkLlamaServerLog(t *testing.T, logs string, httpPort, rpcPort int) {
	t.Helper()
	for _, p := range []string{"--cont-batching", "--cache-prompt", "--prio 3", "--prio-batch 1", "--log-prefix false",
		"--metrics", "--slots", "--perf", "--models-max 1"} {
		if n := strings.Count(logs, "llama-server "+p+": no effect here: "); n != 1 {
			t.Errorf("%d log lines saying %s has no effect", n, p)
		}
	}
	for _, want := range []string{
		"llama-server --models-preset ",
		": 1 preset (tiny-moe): a request naming one's alias switches the engine to it, emptying the slots",
		`llama-server placement: n_gpu_layers=all n_cpu_moe=2 override_tensor=token_embd\.weight=CPU,output\.weight=CPU,output_norm\.weight=CPU`,
		"engine-wide sampler defaults: sampler=",
		"repeat_penalty:1.06", "temperature:0.86", "top_k:20", "top_p:0.95",
		`hydra: placement blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU: 3 weights: blk.1.ffn_gate_exps.weight in `,
		`hydra: placement output\.weight=CPU: 5 weights: output.weight in `,
		fmt.Sprintf("serving HTTP: addr=127.0.0.1:%d", httpPort),
		fmt.Sprintf("serving Hydra RPC: url=tcp://127.0.0.1:%d", rpcPort),
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
	if strings.Contains(logs, "placed no weight") {
		t.Error("a placement rule placed no weight")
	}
}

// A parameter llama-server does not have, or this mode does not know,
// stops the engine before it binds anything, with exit status 2.
func TestLlamaServerRefusesUnknown(t *testing.T) {
	out, err := exec.Command(filepath.Join(binDir, "hydra-engine"), "llama-server", "--port", "1", "--frobnicate").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "unknown parameter --frobnicate") {
		t.Fatalf("exit %v: %s", err, out)
	}
}
