package iface

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckPrompt(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  PrefillRequest
		want string // "" = accepted
	}{
		{"tokens", PrefillRequest{Tokens: []int32{0, 9}}, ""},
		{"text", PrefillRequest{Text: "hi"}, ""},
		{"messages", PrefillRequest{Messages: []Message{{Role: "user", Content: "hi"}}}, ""},
		{"none", PrefillRequest{}, "empty prompt"},
		{"empty tokens", PrefillRequest{Tokens: []int32{}}, "empty prompt"},
		{"two", PrefillRequest{Text: "hi", Tokens: []int32{1}}, "one of messages, tokens and text"},
		{"no role", PrefillRequest{Messages: []Message{{Role: "user"}, {Content: "x"}}}, "message 1 has no role"},
		{"token too big", PrefillRequest{Tokens: []int32{1, 10}}, "token 10 at position 1 is outside the vocabulary [0, 10)"},
		{"negative token", PrefillRequest{Tokens: []int32{-1}}, "outside the vocabulary"},
	} {
		err := tc.req.CheckPrompt(10)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want ErrBadRequest with %q", tc.name, err, tc.want)
		}
	}
}
