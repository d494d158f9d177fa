package host

import (
	"errors"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

func TestCheckPromptSize(t *testing.T) {
	info := iface.BackendInfo{NCtx: 400, NCtxSlot: 100, MaxTokenBytes: 4}
	msgs := func(n int, content string) []iface.Message {
		m := make([]iface.Message, n)
		for i := range m {
			m[i] = iface.Message{Role: "user", Content: content}
		}
		return m
	}
	for _, tc := range []struct {
		req  iface.PrefillRequest
		want string // "" accepted
	}{
		{iface.PrefillRequest{Tokens: make([]int32, 100)}, ""},
		{iface.PrefillRequest{Tokens: make([]int32, 101)}, "101 tokens"},
		{iface.PrefillRequest{Messages: msgs(100, "")}, ""},
		{iface.PrefillRequest{Messages: msgs(101, "")}, "101 messages"},
		{iface.PrefillRequest{Text: strings.Repeat("x", 400)}, ""},
		{iface.PrefillRequest{Text: strings.Repeat("x", 401)}, "401 bytes"},
		{iface.PrefillRequest{Messages: msgs(2, strings.Repeat("x", 200)), Tools: []string{`{"a":1}`}}, "407 bytes"},
		{iface.PrefillRequest{Messages: []iface.Message{{Role: "assistant", ToolCalls: []iface.ToolCall{{Arguments: strings.Repeat("1", 401)}}}}}, "401 bytes"},
	} {
		err := CheckPromptSize(tc.req, info)
		if (err == nil) != (tc.want == "") || (err != nil && (!errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.want))) {
			t.Errorf("%+.60v: %v, want %q", tc.req, err, tc.want)
		}
	}
	if err := CheckPromptSize(iface.PrefillRequest{Text: strings.Repeat("x", 1000)}, iface.BackendInfo{NCtx: 100}); err != nil {
		t.Errorf("without MaxTokenBytes the text is the backend's to check: %v", err)
	}
}
