// Package requesttest helps the dialects' tests compare the chat request a
// converter makes with the chat completion body it stands for.
package requesttest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/hydra-engine/hydra-engine/host/httpapi/request"
)

// ChatJSON is chat as the chat completion body it stands for, its passed
// fields in it, as JSON decodes it, less what Empty drops.
func ChatJSON(t *testing.T, chat request.Chat) map[string]any {
	t.Helper()
	b, err := json.Marshal(chat.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range chat.Passed {
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			t.Fatal(err)
		}
		m[k] = x
	}
	return Empty(m).(map[string]any)
}

// emptyText are the text fields a chat leaves empty where its JSON body
// would leave them out.
var emptyText = []string{"model", "content", "reasoning_content", "name", "tool_call_id"}

// Empty is v, a decoded JSON value, without its nulls and its emptyText
// fields that are "": what a typed body holds for a field it was not given.
func Empty(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if e == nil || e == "" && slices.Contains(emptyText, k) {
				delete(x, k)
				continue
			}
			x[k] = Empty(e)
		}
	case []any:
		for i, e := range x {
			x[i] = Empty(e)
		}
	}
	return v
}
