package host

import (
	"fmt"

	"github.com/hydra-engine/hydra-engine/iface"
)

// CheckPromptSize refuses a prompt that cannot fit a slot, from its size
// alone, before it is rendered or tokenized: more token ids or messages than
// a slot holds tokens (a message renders to one token at least), or more
// bytes of text than that many of the longest token could stand for. Its
// errors wrap iface.ErrBadRequest. A front end checks every prompt with it,
// so that the work a prompt costs before it is refused is bounded by the
// context, whatever the body's size.
func CheckPromptSize(req iface.PrefillRequest, info iface.BackendInfo) error {
	n := info.SlotCtx()
	if n <= 0 {
		return nil
	}
	if len(req.Tokens) > n {
		return fmt.Errorf("%w: the prompt has %d tokens, %s", iface.ErrBadRequest, len(req.Tokens), SlotSize(info))
	}
	if err := CheckMessageCount(len(req.Messages), info); err != nil {
		return err
	}
	if info.MaxTokenBytes <= 0 {
		return nil
	}
	limit := int64(n) * int64(info.MaxTokenBytes)
	size := int64(len(req.Text)) + int64(len(req.TemplateKwargs))
	for _, t := range req.Tools {
		size += int64(len(t))
	}
	for _, m := range req.Messages {
		size += int64(len(m.Content) + len(m.ReasoningContent) + len(m.Name) + len(m.ToolCallID))
		for _, c := range m.ToolCalls {
			size += int64(len(c.ID) + len(c.Name) + len(c.Arguments))
		}
	}
	if size > limit {
		return fmt.Errorf("%w: the prompt's %d bytes of text cannot fit: %s, and no token stands for more than %d bytes",
			iface.ErrBadRequest, size, SlotSize(info), info.MaxTokenBytes)
	}
	return nil
}

// CheckMessageCount is CheckPromptSize's check of the number of messages,
// for a front end to make before it converts them.
func CheckMessageCount(n int, info iface.BackendInfo) error {
	if c := info.SlotCtx(); c > 0 && n > c {
		return fmt.Errorf("%w: %d messages cannot fit: %s, and each message takes one token at least", iface.ErrBadRequest, n, SlotSize(info))
	}
	return nil
}

// SlotSize says how many tokens a slot holds and why, for errors.
func SlotSize(info iface.BackendInfo) string {
	if info.SplitKV() {
		return fmt.Sprintf("a slot holds %d (n_ctx %d split across %d slots)", info.SlotCtx(), info.NCtx, info.NSlots)
	}
	return fmt.Sprintf("a slot holds %d (n_ctx)", info.SlotCtx())
}
