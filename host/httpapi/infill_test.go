package httpapi

import (
	"bufio"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
)

const (
	fPre, fSuf, fMid, fRep, fSep = mock.FIMPre, mock.FIMSuf, mock.FIMMid, mock.FIMRep, mock.FIMSep
)

func cat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestInfill: /infill over the mock builds the prompt of the body's
// pieces (the mock's bytes), decodes it as a completion, and answers in
// llama-server's native shape, streamed or whole; the slot is free after.
func TestInfill(t *testing.T) {
	b, info := loadMock(t, 1)
	rb := &recordingBackend{Backend: b}
	s, h := serve(t, rb, info, nil)
	body := `{"input_prefix":"def f(","input_suffix":")\n","input_extra":[{"filename":"a.py","text":"x=1"},{"text":"y"}],"prompt":"a","n_predict":4}`
	rec := post(h, "/infill", body)
	var out map[string]any
	decodeBody(t, rec.Body.Bytes(), &out)
	extra := cat([]int32{fRep}, bytesOf("myproject\n"), []int32{fSep}, bytesOf("a.py\n", "x=1"), []int32{fSep}, bytesOf("tmp\n", "y"),
		[]int32{fSep}, bytesOf("filename\n"))
	want := cat(extra, []int32{fPre}, bytesOf("def f(", "a"), []int32{fSuf}, bytesOf(")\n"), []int32{fMid})
	if rec.Code != 200 || len(rb.prompts) != 1 || !reflect.DeepEqual(rb.prompts[0], want) {
		t.Fatalf("infill: %d %s, prompt %v, want %v", rec.Code, rec.Body, rb.prompts, want)
	}
	content, _ := out["content"].(string)
	if out["stop"] != true || out["tokens_predicted"] != 4.0 || out["tokens_evaluated"] != float64(len(want)) || out["id_slot"] != 0.0 ||
		out["stop_type"] != "limit" || out["model"] != "mock" || len(content) != 4 || out["timings"] == nil || out["index"] != 0.0 {
		t.Errorf("infill reply: %s", rec.Body)
	}
	// Streamed: one event a token, then the last with stop, and no [DONE];
	// the prompt has the repository's and the file's names (21 tokens).
	rec = post(h, "/infill", `{"input_prefix":"a","input_suffix":"b","n_predict":3,"stream":true}`)
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
		t.Fatalf("stream: %d %s", rec.Code, rec.Body)
	}
	var events []map[string]any
	sc := bufio.NewScanner(strings.NewReader(rec.Body.String()))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		var ev map[string]any
		if !ok || json.Unmarshal([]byte(data), &ev) != nil {
			t.Fatalf("stream line %q", line)
		}
		events = append(events, ev)
	}
	var streamed string
	for i, ev := range events {
		last := i == len(events)-1
		if ev["stop"] != last {
			t.Errorf("event %d of %d: stop %v", i, len(events), ev["stop"])
		}
		if !last {
			streamed += ev["content"].(string)
			if ev["tokens_predicted"] != float64(i+1) {
				t.Errorf("event %d: tokens_predicted %v", i, ev["tokens_predicted"])
			}
		}
	}
	if len(events) != 4 || len(streamed) != 3 || events[3]["stop_type"] != "limit" || events[3]["tokens_evaluated"] != 26.0 {
		t.Errorf("stream events: %v", events)
	}
	for i, v := range s.Slots() {
		if v.Processing {
			t.Errorf("slot %d still processing", i)
		}
	}
}

// TestInfillRefusals: llama-server's 501 for a model without FIM tokens,
// and 400s naming the field for bad bodies.
func TestInfillRefusals(t *testing.T) {
	b, info := loadMock(t, 1)
	sp := *info.Special
	sp.FIMPre, sp.FIMMid = iface.NoToken, iface.NoToken
	info.Special = &sp
	_, h := serve(t, b, info, nil)
	rec := post(h, "/infill", `{"input_prefix":"a","input_suffix":"b"}`)
	if e := errorOf(t, rec.Body.Bytes()); rec.Code != 501 || e["type"] != "not_supported_error" ||
		e["message"] != "Infill is not supported by this model: prefix token is missing. middle token is missing. " {
		t.Errorf("no FIM tokens: %d %s", rec.Code, rec.Body)
	}
	_, h = newTestServer(t, 1)
	for _, c := range []struct{ body, param, msg string }{
		{`{"input_suffix":"b"}`, "input_prefix", `"input_prefix" is required`},
		{`{"input_prefix":"a"}`, "input_suffix", `"input_suffix" is required`},
		{`{"input_prefix":"a","input_suffix":"b","prompt":3}`, "prompt", `"prompt" must be a string`},
		{`{"input_prefix":"a","input_suffix":"b","input_extra":{}}`, "input_extra", `"input_extra" must be an array`},
		{`{"input_prefix":"a","input_suffix":"b","input_extra":[{"filename":"x"}]}`, "input_extra", `must contain a "text" field`},
		{`{"input_prefix":"a","input_suffix":"b","input_extra":[{"text":"x","filename":1}]}`, "input_extra", `"filename" field must be a string`},
		{`{"input_prefix":3,"input_suffix":"b"}`, "input_prefix", "input_prefix must be a string or an array"},
		{`{"input_prefix":["a",[1]],"input_suffix":"b"}`, "input_prefix[1]", "input_prefix[1] must be a string or a token id"},
		{`{"input_prefix":"a","input_suffix":"b","temperature":"hot"}`, "temperature", "field temperature"},
	} {
		rec := post(h, "/infill", c.body)
		e := errorOf(t, rec.Body.Bytes())
		param, _ := e["param"].(string)
		msg, _ := e["message"].(string)
		if rec.Code != 400 || param != c.param || !strings.Contains(msg, c.msg) {
			t.Errorf("%s: %d %s, want param %q and %q", c.body, rec.Code, rec.Body, c.param, c.msg)
		}
	}
}
