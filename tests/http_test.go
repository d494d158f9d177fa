package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// httpDo sends one request and returns the status, the body and the reply.
func httpDo(t testing.TB, method, url, body string) (int, []byte, *http.Response) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp
}

// httpJSON expects status want and decodes the body into v.
func httpJSON(t testing.TB, method, url, body string, want int, v any) {
	t.Helper()
	code, b, resp := httpDo(t, method, url, body)
	if code != want {
		t.Fatalf("%s %s: %d %s, want %d", method, url, code, b, want)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %s: Content-Type %q", method, url, ct)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, b)
		}
	}
}

// openAIError is the error object OpenAI clients parse.
type openAIError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

func TestHTTPHealthVersionModelsSlots(t *testing.T) {
	e, base := startHTTPEngine(t, "--slots", "3")
	c := client(t, e.tcp)

	var health map[string]any
	httpJSON(t, "GET", base+"/health", "", 200, &health)
	if health["status"] != "ok" || health["startup_stage"] != 4.0 || health["has_model"] != true ||
		health["model_name"] != "mock" || health["rpc_active"] != true {
		t.Errorf("/health %v", health)
	}
	var version map[string]any
	httpJSON(t, "GET", base+"/version", "", 200, &version)
	if version["engine"] != "hydra-engine" || version["version"] == "" || version["backend"] != "mock" {
		t.Errorf("/version %v", version)
	}
	info, _ := mustOK(t, c, transport.OpInfo, "0", nil)
	for _, path := range []string{"/v1/models", "/models"} {
		var models struct {
			Object string `json:"object"`
			Data   []struct {
				ID, Object, OwnedBy string
				Meta                map[string]any `json:"meta"`
			} `json:"data"`
		}
		httpJSON(t, "GET", base+path, "", 200, &models)
		if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "mock" ||
			models.Data[0].Object != "model" || models.Data[0].Meta["model_hash"] != info["model_hash"] {
			t.Errorf("%s %+v", path, models)
		}
	}

	// A sequence prefilled over RPC shows in /slots and state/meta, with the
	// same figures and identity as STATE_META.
	mustOK(t, c, transport.OpPrefill, "1", chat("Hello over RPC"))
	rpcMeta, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
	var slots []map[string]any
	httpJSON(t, "GET", base+"/slots", "", 200, &slots)
	if len(slots) != 3 {
		t.Fatalf("/slots has %d slots", len(slots))
	}
	for i, s := range slots {
		if s["id"] != float64(i) || s["n_ctx"] != 32768.0 || s["is_processing"] != false || s["speculative"] != false {
			t.Errorf("/slots[%d] %v", i, s)
		}
	}
	if slots[1]["n_past"] != float64(num(t, rpcMeta, "n_past")) || slots[0]["n_past"] != 0.0 {
		t.Errorf("/slots n_past %v %v, STATE_META %v", slots[0]["n_past"], slots[1]["n_past"], rpcMeta)
	}
	var meta map[string]any
	httpJSON(t, "GET", base+"/slots/1/state/meta", "", 200, &meta)
	for _, k := range []string{"n_past", "state_size", "is_processing", "model_alias", "model_hash", "model_path"} {
		if fmt.Sprint(meta[k]) != fmt.Sprint(rpcMeta[k]) {
			t.Errorf("state/meta %s = %v, STATE_META has %v", k, meta[k], rpcMeta[k])
		}
	}
	if meta["slot_id"] != 1.0 {
		t.Errorf("state/meta %v", meta)
	}
	for _, bad := range []string{"/slots/3/state/meta", "/slots/x/state/meta", "/slots/-1/state/meta"} {
		code, b, _ := httpDo(t, "GET", base+bad, "")
		if code != 400 || strings.TrimSpace(string(b)) != `{"error":"invalid slot ID"}` {
			t.Errorf("%s: %d %s", bad, code, b)
		}
	}

	// Erase empties the slot for RPC too.
	var erased map[string]any
	httpJSON(t, "POST", base+"/slots/1?action=erase", "", 200, &erased)
	if erased["id_slot"] != 1.0 || erased["n_erased"] != float64(num(t, rpcMeta, "n_past")) {
		t.Errorf("erase %v", erased)
	}
	if m, _ := mustOK(t, c, transport.OpStateMeta, "1", nil); num(t, m, "n_past") != 0 {
		t.Errorf("after erase STATE_META %v", m)
	}
	for _, bad := range []struct {
		path string
		code int
	}{{"/slots/1?action=save", 400}, {"/slots/1", 400}, {"/slots/9?action=erase", 400}} {
		if code, b, _ := httpDo(t, "POST", base+bad.path, ""); code != bad.code || !strings.Contains(string(b), `"error"`) {
			t.Errorf("POST %s: %d %s", bad.path, code, b)
		}
	}
}

// chatResponse is a non-streamed chat completion as OpenAI clients read it.
type chatResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Timings map[string]float64 `json:"timings"`
	IDSlot  int                `json:"id_slot"`
}

// streamChunk is one SSE chunk as OpenAI clients read it.
type streamChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error *json.RawMessage `json:"error"`
}

// sseEvent is a parsed data: line and when it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

// readSSE reads a text/event-stream as OpenAI's clients do: events are
// separated by a blank line, each a "data: " line; it checks the framing.
func readSSE(t testing.TB, r io.Reader) []sseEvent {
	t.Helper()
	var events []sseEvent
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			return events
		}
		if err != nil {
			t.Fatalf("SSE stream: %v after %d events", err, len(events))
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.HasSuffix(data, "\n") {
			t.Fatalf("SSE line %q is not a data: line", line)
		}
		events = append(events, sseEvent{strings.TrimSuffix(data, "\n"), time.Now()})
		if blank, err := br.ReadString('\n'); blank != "\n" || err != nil {
			t.Fatalf("SSE event %q not followed by a blank line: %q %v", data, blank, err)
		}
	}
}

// stream posts a streaming completion and returns its chunks, checking the
// OpenAI framing: JSON chunks of one id and object, finish_reason on the
// last chunk with choices only, an optional usage chunk, then [DONE].
func stream(t testing.TB, url, body, object string) (text string, chunks []streamChunk, events []sseEvent) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctxT(t), "POST", url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	events = readSSE(t, resp.Body)
	if len(events) < 2 || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream does not end with [DONE]: %v", events)
	}
	finished := false
	for i, ev := range events[:len(events)-1] {
		var ch streamChunk
		if err := json.Unmarshal([]byte(ev.data), &ch); err != nil {
			t.Fatalf("chunk %d is not JSON: %q", i, ev.data)
		}
		if ch.Object != object || ch.ID == "" || (i > 0 && ch.ID != chunks[0].ID) || ch.Error != nil {
			t.Fatalf("chunk %d: %s", i, ev.data)
		}
		if len(ch.Choices) == 0 {
			if ch.Usage == nil || i != len(events)-2 {
				t.Fatalf("chunk %d has no choices and is not the final usage chunk: %s", i, ev.data)
			}
		} else {
			if finished {
				t.Fatalf("chunk %d after the finish_reason chunk: %s", i, ev.data)
			}
			c := ch.Choices[0]
			finished = c.FinishReason != nil
			switch {
			case c.Delta != nil && c.Delta.Content != nil:
				text += *c.Delta.Content
			case c.Text != nil:
				text += *c.Text
			}
		}
		chunks = append(chunks, ch)
	}
	if !finished {
		t.Fatal("no chunk carried finish_reason")
	}
	return text, chunks, events
}

func TestHTTPChatCompletions(t *testing.T) {
	e, base := startHTTPEngine(t)
	c := client(t, e.tcp)
	const prompt = "Tell me about Hydra."
	messages := `[{"role":"system","content":"be brief"},{"role":"user","content":"` + prompt + `"}]`

	// The RPC path gives the reference text: same template, greedy decode.
	mustOK(t, c, transport.OpPrefill, "3", []byte(`{"messages":`+messages+`}`))
	want, _ := decodeText(t, c, "3", 24)
	pre, _ := mustOK(t, c, transport.OpStateMeta, "3", nil)

	var r chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"model":"mock","messages":`+messages+`,"max_tokens":24,"id_slot":1}`, 200, &r)
	if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") || r.Model != "mock" || r.Created == 0 ||
		len(r.Choices) != 1 || r.Choices[0].Message.Role != "assistant" || r.IDSlot != 1 {
		t.Fatalf("chat completion %+v", r)
	}
	if got := r.Choices[0].Message.Content; got != want || r.Choices[0].FinishReason != "length" {
		t.Errorf("content %q (%s), RPC decode gave %q", got, r.Choices[0].FinishReason, want)
	}
	nPrompt := int(num(t, pre, "n_past")) - 24
	if r.Usage.PromptTokens != nPrompt || r.Usage.CompletionTokens != 24 || r.Usage.TotalTokens != nPrompt+24 {
		t.Errorf("usage %+v, want %d prompt tokens", r.Usage, nPrompt)
	}
	if r.Timings["prompt_n"] != float64(nPrompt) || r.Timings["predicted_n"] != 24 || r.Timings["predicted_per_second"] <= 0 {
		t.Errorf("timings %v", r.Timings)
	}
	// The completion ran in slot 1 of the same slot table: RPC sees it.
	if m, _ := mustOK(t, c, transport.OpStateMeta, "1", nil); num(t, m, "n_past") != int64(nPrompt+24) {
		t.Errorf("slot 1 after the completion: %v", m)
	}

	// /chat/completions is the same endpoint; sampler fields are honoured.
	var r2 chatResponse
	httpJSON(t, "POST", base+"/chat/completions", `{"messages":`+messages+`,"n_predict":24}`, 200, &r2)
	if r2.Choices[0].Message.Content != want {
		t.Errorf("/chat/completions %q, want %q", r2.Choices[0].Message.Content, want)
	}
	sampled := `{"messages":` + messages + `,"max_tokens":24,"temperature":0.9,"top_k":4,"seed":42}`
	var s1, s2 chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", sampled, 200, &s1)
	httpJSON(t, "POST", base+"/v1/chat/completions", sampled, 200, &s2)
	if s1.Choices[0].Message.Content != s2.Choices[0].Message.Content || s1.Choices[0].Message.Content == want {
		t.Errorf("seeded sampling: %q and %q (greedy %q)", s1.Choices[0].Message.Content, s2.Choices[0].Message.Content, want)
	}

	// n_predict 0 is the coordinator's prefill-only call.
	var p chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":`+messages+`,"n_predict":0,"id_slot":2}`, 200, &p)
	if p.Choices[0].Message.Content != "" || p.Usage.CompletionTokens != 0 || p.Usage.PromptTokens != nPrompt {
		t.Errorf("n_predict 0: %+v", p)
	}

	// Streaming: the same text, token by token.
	text, chunks, _ := stream(t, base+"/v1/chat/completions",
		`{"messages":`+messages+`,"max_tokens":24,"stream":true,"stream_options":{"include_usage":true}}`, "chat.completion.chunk")
	if text != want {
		t.Errorf("streamed %q, want %q", text, want)
	}
	first := chunks[0].Choices[0].Delta
	if first == nil || first.Role == nil || *first.Role != "assistant" {
		t.Errorf("first chunk %+v", chunks[0])
	}
	if n := len(chunks); n != 24+3 { // role, 24 tokens, finish, usage
		t.Errorf("%d chunks, want 27", n)
	}
	last := chunks[len(chunks)-2].Choices[0]
	if *last.FinishReason != "length" {
		t.Errorf("finish_reason %q", *last.FinishReason)
	}
	if u := chunks[len(chunks)-1].Usage; u.CompletionTokens != 24 || u.PromptTokens != nPrompt || u.TotalTokens != nPrompt+24 {
		t.Errorf("usage chunk %+v", u)
	}
	// Without include_usage no chunk has usage.
	_, chunks, _ = stream(t, base+"/v1/chat/completions", `{"messages":`+messages+`,"max_tokens":4,"stream":true}`, "chat.completion.chunk")
	for _, ch := range chunks {
		if ch.Usage != nil {
			t.Errorf("usage without include_usage: %+v", ch)
		}
	}

	// Errors are OpenAI error objects.
	for _, bad := range []struct {
		body string
		code int
		typ  string
	}{
		{`{"messages":[]}`, 400, "invalid_request_error"},
		{`{"messages":[{"content":"no role"}]}`, 400, "invalid_request_error"},
		{`{"messages":` + messages + `,"id_slot":9}`, 400, "invalid_request_error"},
		{`not json`, 400, "invalid_request_error"},
	} {
		var oe openAIError
		httpJSON(t, "POST", base+"/v1/chat/completions", bad.body, bad.code, &oe)
		if oe.Error.Type != bad.typ || oe.Error.Message == "" {
			t.Errorf("%s: %+v", bad.body, oe)
		}
	}
}

// TestHTTPStreamsAsGenerated: with a per-token delay in the backend, chunks
// arrive spread over the decode, not all at its end.
func TestHTTPStreamsAsGenerated(t *testing.T) {
	_, base := startHTTPEngine(t, "--backend-opt", "op_delay_ms=40")
	start := time.Now()
	_, chunks, events := stream(t, base+"/v1/completions", `{"prompt":"stream me","max_tokens":10,"stream":true}`, "text_completion")
	if len(chunks) < 5 {
		t.Fatalf("%d chunks", len(chunks))
	}
	firstToken, end := events[0].at, events[len(events)-1].at
	if end.Sub(firstToken) < 250*time.Millisecond || end.Sub(start) < 400*time.Millisecond {
		t.Errorf("first chunk %v and last %v after the request: not streamed as generated", firstToken.Sub(start), end.Sub(start))
	}
}

func TestHTTPTextCompletions(t *testing.T) {
	e, base := startHTTPEngine(t)
	c := client(t, e.tcp)
	const prompt = "Once upon a time"
	// The mock's tokens are bytes: the same prompt as raw token ids over RPC.
	ids := make([]string, len(prompt))
	for i := range prompt {
		ids[i] = strconv.Itoa(int(prompt[i]))
	}
	tok := func(s string) []byte {
		b := make([]byte, 0, 4*len(s))
		for i := range s {
			b = append(b, s[i], 0, 0, 0)
		}
		return b
	}
	mustOK(t, c, transport.OpPrefill, "3", tok(prompt))
	want, _ := decodeText(t, c, "3", 16)

	for _, p := range []string{`"` + prompt + `"`, "[" + strings.Join(ids, ",") + "]", `["` + prompt + `"]`} {
		var r chatResponse
		httpJSON(t, "POST", base+"/v1/completions", `{"prompt":`+p+`,"max_tokens":16}`, 200, &r)
		if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || r.Choices[0].Text != want ||
			r.Usage.PromptTokens != len(prompt) || r.Usage.CompletionTokens != 16 {
			t.Errorf("prompt %s: %+v, want text %q", p, r, want)
		}
	}
	text, _, _ := stream(t, base+"/v1/completions", `{"prompt":"`+prompt+`","max_tokens":16,"stream":true,"stream_options":{"include_usage":true}}`, "text_completion")
	if text != want {
		t.Errorf("streamed %q, want %q", text, want)
	}
	var oe openAIError
	httpJSON(t, "POST", base+"/v1/completions", `{"prompt":["a","b"]}`, 400, &oe)
	if oe.Error.Type != "invalid_request_error" {
		t.Errorf("batch prompt: %+v", oe)
	}
}

// TestHTTPSharesSlotsWithRPC: a completion holds its slot in the same table
// as the RPC ops; each side gets BUSY (503 on HTTP) while the other runs.
func TestHTTPSharesSlotsWithRPC(t *testing.T) {
	e, base := startHTTPEngine(t, "--slots", "2", "--backend-opt", "op_delay_ms=30")
	c := client(t, e.tcp)
	mustOK(t, c, transport.OpPrefill, "0", chat("hold me"))

	// An RPC DECODE holds slot 0 for ~1.5 s.
	done := make(chan error, 1)
	go func() {
		c2, err := transport.DialClient(ctxT(t), e.unix)
		if err != nil {
			done <- err
			return
		}
		defer c2.Close()
		resp, _, err := c2.Call(ctxT(t), transport.OpDecode, "0", decodeJSON(50))
		if err == nil && resp.Status != transport.StatusOK {
			err = resp.Err()
		}
		done <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var slots []map[string]any
		httpJSON(t, "GET", base+"/slots", "", 200, &slots)
		if slots[0]["is_processing"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot 0 never showed as processing")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// With no id_slot the completion takes the idle slot 1.
	var r chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, 200, &r)
	if r.IDSlot != 1 {
		t.Errorf("auto slot %d, want 1", r.IDSlot)
	}
	// Naming the busy slot waits for it, as llama-server defers a task for
	// a busy slot: the completion runs once the RPC DECODE is done.
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"id_slot":0,"max_tokens":1}`, 200, &r)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("the completion naming slot 0 ran while the RPC DECODE held it")
	}
	if r.IDSlot != 0 {
		t.Errorf("named slot %d, want 0", r.IDSlot)
	}

	// The other way: a streamed completion holds slot 1; RPC PREFILL gets BUSY.
	req, _ := http.NewRequestWithContext(ctxT(t), "POST", base+"/v1/completions", strings.NewReader(`{"prompt":"slow","max_tokens":40,"stream":true,"id_slot":1}`))
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(sresp.Body)
	if _, err := br.ReadString('\n'); err != nil { // the first chunk: decoding now
		t.Fatal(err)
	}
	if st, m, _ := call(t, c, transport.OpPrefill, "1", chat("x")); st != transport.StatusBusy {
		t.Errorf("PREFILL during a completion: %v %v", st, m)
	}
	// A client that goes away ends the decode and frees the slot.
	sresp.Body.Close()
	deadline = time.Now().Add(5 * time.Second)
	for {
		if st, _, _ := call(t, c, transport.OpPrefill, "1", chat("x")); st == transport.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("slot 1 still busy after the client left")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metricsOf scrapes /metrics into name{labels} → value.
func metricsOf(t testing.TB, base string) map[string]float64 {
	t.Helper()
	code, b, _ := httpDo(t, "GET", base+"/metrics", "")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	m := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q", line)
		}
		m[line[:i]] = v
	}
	return m
}

// grepMetrics is the metrics whose names hold sub.
func grepMetrics(m map[string]float64, sub string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.Contains(k, sub) {
			out[k] = v
		}
	}
	return out
}

func TestHTTPMetrics(t *testing.T) {
	e, base := startHTTPEngine(t)
	c := client(t, e.tcp)
	before := metricsOf(t, base)
	if before[`hydra_engine_state_chunk_size_bytes`] != 2097152 || before[`hydra_engine_slots`] != 4 {
		t.Errorf("initial gauges: chunk %v slots %v", before[`hydra_engine_state_chunk_size_bytes`], before[`hydra_engine_slots`])
	}
	if _, ok := before[`hydra_engine_plugin_restarts_total`]; !ok {
		t.Error("no hydra_engine_plugin_restarts_total")
	}

	mustOK(t, c, transport.OpConfigure, "0", []byte(`{"state_chunk_size":65536}`))
	mustOK(t, c, transport.OpPrefill, "0", chat("metrics, please"))
	_, blob := getState(t, c, "0")
	mustOK(t, c, transport.OpStatePut, "1", blob)
	decodeText(t, c, "1", 8)
	call(t, c, transport.OpStateGet, "7", nil) // NOT_FOUND
	var r chatResponse
	httpJSON(t, "POST", base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, 200, &r)

	m := metricsOf(t, base)
	for _, want := range []struct {
		name string
		min  float64
	}{
		{`hydra_engine_requests_total{op="CONFIGURE",status="OK"}`, 1},
		{`hydra_engine_requests_total{op="PREFILL",status="OK"}`, 1},
		{`hydra_engine_requests_total{op="STATE_GET",status="OK"}`, 1},
		{`hydra_engine_requests_total{op="STATE_GET",status="NOT_FOUND"}`, 1},
		{`hydra_engine_requests_total{op="STATE_PUT",status="OK"}`, 1},
		{`hydra_engine_requests_total{op="DECODE",status="OK"}`, 1},
		{`hydra_engine_request_seconds_total{op="STATE_GET",status="OK"}`, 1e-9},
		// PREFILL's blob and STATE_GET both stream a state out.
		{`hydra_engine_state_transfer_seconds_count{direction="get"}`, 2},
		{`hydra_engine_state_transfer_seconds_count{direction="put"}`, 1},
		{`hydra_engine_state_transfer_seconds_bucket{direction="put",le="+Inf"}`, 1},
		{`hydra_engine_state_transfer_seconds_sum{direction="put"}`, 1e-9},
		{`hydra_engine_state_transfer_bytes_sum{direction="put"}`, float64(len(blob))},
		{`hydra_engine_state_transfer_bytes_count{direction="get"}`, 2},
		// A STATE_GET on the shm plane waits for the plugin's first chunk at least.
		{`hydra_engine_state_transfer_backend_wait_seconds_total{direction="get"}`, 1e-9},
		{`hydra_engine_tokens_total{phase="prefill"}`, 1},
		{`hydra_engine_tokens_total{phase="decode"}`, 13},
		{`hydra_engine_token_seconds_total{phase="decode"}`, 1e-9},
		{`hydra_engine_tokens_per_second_count{phase="prefill"}`, 2},
		{`hydra_engine_tokens_per_second_count{phase="decode"}`, 2},
		{`hydra_engine_http_requests_total{code="200",handler="POST /v1/chat/completions"}`, 1},
		// The chat completion's 5 tokens: a first, and 4 gaps after it.
		{`hydra_engine_time_to_first_token_seconds_count{model="mock"}`, 1},
		{`hydra_engine_time_to_first_token_seconds_sum{model="mock"}`, 1e-9},
		{`hydra_engine_inter_token_latency_seconds_count{model="mock"}`, 4},
		{`hydra_engine_http_queue_seconds_count{model="mock"}`, 1},
		{`hydra_engine_rpc_connections`, 1}, // this test's client
		{`llamacpp:prompt_tokens_total`, 1},
		{`llamacpp:tokens_predicted_total`, 13},
		{`hydra_engine_payload_budget_bytes`, 1},
		{`go_goroutines`, 1},
	} {
		if v, ok := m[want.name]; !ok || v < want.min {
			t.Errorf("%s = %v (present %v), want >= %v", want.name, v, ok, want.min)
		}
	}
	if v := m[`hydra_engine_state_transfer_bytes_sum{direction="put"}`]; v != float64(len(blob)) {
		t.Errorf("put bytes %v, want %d", v, len(blob))
	}
	// By path: the PREFILL's blob and the STATE_GET on the shm ring, the
	// STATE_PUT from TCP spliced into the plugin's pipes.
	if m[`hydra_engine_state_transfer_path_transfers_total{direction="get",path="shm-ring"}`] != 2 ||
		m[`hydra_engine_state_transfer_path_bytes_total{direction="put",path="shm-pipes"}`] != float64(len(blob)) ||
		m[`hydra_engine_state_transfer_path_seconds_total{direction="put",path="shm-pipes"}`] <= 0 {
		t.Errorf("transfers by path: %v", grepMetrics(m, "state_transfer_path"))
	}
	if n := strings.Count(e.logs.String(), "[INFO]  hydra-engine: state transfer:"); n != 3 {
		t.Errorf("%d state transfers logged at info, want 3", n)
	}
	for _, dir := range []string{"get", "put"} {
		wait, ok := m[`hydra_engine_state_transfer_backend_wait_seconds_total{direction="`+dir+`"}`]
		if sum := m[`hydra_engine_state_transfer_seconds_sum{direction="`+dir+`"}`]; !ok || wait > sum {
			t.Errorf("%s: backend wait %v s (present %v) beyond the transfers' %v s", dir, wait, ok, sum)
		}
	}
	if _, ok := m[`hydra_engine_rpc_connections_refused_total`]; !ok || m[`hydra_engine_payload_budget_in_use_bytes`] != 0 {
		t.Errorf("limits: refused present %v, budget in use %v", ok, m[`hydra_engine_payload_budget_in_use_bytes`])
	}
	if m[`hydra_engine_state_chunk_size_bytes`] != 65536 || m[`hydra_engine_slots_busy`] != 0 ||
		m[`hydra_engine_state_transfer_failures_total{direction="put"}`] != 0 {
		t.Errorf("gauges: chunk %v busy %v put failures %v", m[`hydra_engine_state_chunk_size_bytes`],
			m[`hydra_engine_slots_busy`], m[`hydra_engine_state_transfer_failures_total{direction="put"}`])
	}
	// Every metric the Grafana dashboard queries exists.
	dash, err := os.ReadFile("../deploy/grafana/hydra-engine.json")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for k := range m {
		names[strings.SplitN(k, "{", 2)[0]] = true
	}
	for _, name := range regexp.MustCompile(`hydra_engine_[a-z_]+`).FindAllString(string(dash), -1) {
		if !names[name] {
			t.Errorf("the dashboard queries %s, which /metrics does not serve", name)
		}
	}
	found := false
	for k, v := range m {
		if strings.HasPrefix(k, `hydra_engine_info{`) && strings.Contains(k, `backend="mock"`) && v == 1 {
			found = true
		}
	}
	if !found {
		t.Error("no hydra_engine_info for the mock")
	}
}

// TestConfigFileAndPrintConfig: the engine runs with what --config says,
// and --print-config shows the effective values with their sources.
func TestConfigFileAndPrintConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "hydra-engine.yaml")
	if err := os.WriteFile(cfg, []byte("slots: 2\nbackend_opts:\n  alias: from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "hydra-engine"), "--config", cfg, "--print-config", "--backend-opt", "n_ctx=4096")
	cmd.Env = append(os.Environ(), "HYDRA_SLOTS=3", "HYDRA_LOG_LEVEL=debug")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("--print-config: %v", err)
	}
	for _, want := range []string{"slots: 3 # env HYDRA_SLOTS", "log_level: debug # env HYDRA_LOG_LEVEL",
		"backend_opts: # file " + cfg + ", flag --backend-opt\n  alias: from-file\n  n_ctx: \"4096\"", "idle_timeout: 2m0s # default"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}

	e, base := startHTTPEngine(t, "--config", cfg)
	var slots []map[string]any
	httpJSON(t, "GET", base+"/slots", "", 200, &slots)
	if len(slots) != 2 {
		t.Errorf("%d slots, the file says 2", len(slots))
	}
	if m, _ := mustOK(t, client(t, e.tcp), transport.OpInfo, "0", nil); m["model_alias"] != "from-file" {
		t.Errorf("INFO %v: backend_opts from the file not applied", m)
	}
}
