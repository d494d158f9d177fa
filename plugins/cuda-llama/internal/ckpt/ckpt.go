// Package ckpt holds the rules of context checkpoints, llama-server's at the
// llama.cpp tree the plugin builds against (tools/server/server-context.cpp):
// where a prompt is broken so that a checkpoint can be taken before a chunk,
// which checkpoint a new prompt restores, which are dropped, and the byte
// budget every slot's checkpoints share. A checkpoint is the part of one
// sequence's memory that cannot be cut back (the recurrent rows of a hybrid
// or recurrent model, the window of a sliding-window cache), saved in host
// memory before a chunk of a prompt is evaluated. The package moves no state:
// the plugin saves and restores the bytes through llama.cpp; this is plain
// Go, tested without cgo.
package ckpt

import "slices"

// Checkpoint is one saved point of a sequence.
type Checkpoint struct {
	// PosMin and PosMax are the memory's positions when it was saved.
	PosMin, PosMax int
	// NTokens is the tokens the sequence held: evaluation resumes there.
	NTokens int
	// Data is the memory's partial state (llama.cpp's
	// LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY).
	Data []byte
	// Task is the prompt that took it: a prompt never drops its own for
	// being too close to another (llama-server's id_task).
	Task uint64
}

// Size is the host memory the checkpoint holds.
func (c *Checkpoint) Size() int64 { return int64(len(c.Data)) }

// Rules are a context's checkpoint settings.
type Rules struct {
	// Max is the checkpoints a slot keeps (--ctx-checkpoints); 0: none.
	Max int
	// MinStep is the least spacing in tokens between two checkpoints of a
	// slot, except near a prompt's end and at its last user message
	// (--checkpoint-min-step); 0: no minimum.
	MinStep int
	// NBatch and NUBatch are the context's batch sizes.
	NBatch, NUBatch int
	// NSWA is the sliding window; 0 for a model without one.
	NSWA int
}

// Defaults are llama-server's (common/common.h).
const (
	DefaultMax     = 32
	DefaultMinStep = 8192
)

// endOffsets are how many tokens before a prompt's end the last chunks
// break, so that checkpoints are taken there: n_ubatch + 4 and 4, as
// llama-server (llama.cpp #20288). An identical prompt then evaluates its
// last 4 tokens again, and a prompt cut within its last n_ubatch tokens
// resumes from N − 4 − n_ubatch.
func (r Rules) endOffsets() [2]int { return [2]int{4 + r.NUBatch, 4} }

// Spans are the positions where a prompt's user messages start, from the
// chat template's message delimiters; empty for a prompt of token ids.
type Spans struct {
	UserStarts []int // ascending
}

// isUserStart reports whether a user message starts at pos.
func (s Spans) isUserStart(pos int) bool {
	_, ok := slices.BinarySearch(s.UserStarts, pos)
	return ok
}

// lastUser is where the last user message starts; -1 without one.
func (s Spans) lastUser() int {
	if len(s.UserStarts) == 0 {
		return -1
	}
	return s.UserStarts[len(s.UserStarts)-1]
}

// ChunkEnd is where a chunk of a prompt of n tokens that starts at next and
// may take up to room tokens ends: early at the start of a user message
// worth a checkpoint (the last one, the first one while the slot has no
// checkpoint, or one more than MinStep past the newest checkpoint) and at
// each of the end offsets, so that a checkpoint can be taken before the next
// chunk. newest is the NTokens of the slot's newest checkpoint; -1 for none.
func (r Rules) ChunkEnd(n, next, room int, spans Spans, newest int) int {
	end := min(n, next+room)
	if r.Max <= 0 {
		return end
	}
	last := spans.lastUser()
	for pos := next + 1; pos <= end; pos++ {
		if spans.isUserStart(pos) && (pos == last || newest < 0 || pos > newest+r.MinStep) {
			return pos
		}
		for _, off := range r.endOffsets() {
			if n == pos+min(r.NBatch, off) {
				return pos
			}
		}
	}
	return end
}

// Take reports whether a checkpoint is taken before the chunk [start, end)
// of a prompt of n tokens is evaluated. memMin is the sequence's first
// position in memory (-1: empty, nothing to save); newest is the NTokens of
// the slot's newest checkpoint (-1: none). Mid-prompt chunks take one only
// where they start a user message; a chunk that ends the prompt, or starts
// within n_ubatch of its end, always may; otherwise not within MinStep of the
// newest, unless at the last user message.
func (r Rules) Take(n, start, end, memMin int, spans Spans, newest int) bool {
	if r.Max <= 0 || memMin < 0 {
		return false
	}
	nearEnd := n < end+r.NUBatch
	userStart := spans.isUserStart(start)
	if end < n && !userStart && !nearEnd {
		return false
	}
	return newest < 0 || start == spans.lastUser() || nearEnd || start > newest+r.MinStep
}

// Resume is where a new prompt resumes on a sequence whose memory cannot be
// cut at the prompt's common prefix with it.
type Resume struct {
	// Keep is the tokens of the sequence kept: the prompt is evaluated
	// from there (0: from the start).
	Keep int
	// Restore is the checkpoint to load first; nil for none.
	Restore *Checkpoint
	// PosNext is the next position: the slot's checkpoints that end past
	// it are dropped (List.After).
	PosNext int
}

// Find is llama-server's choice for a prompt of n tokens whose common prefix
// with the sequence is prefix, over a memory whose first position is memMin:
// the newest checkpoint that ends at or before the prefix and begins early
// enough to serve the next position (a checkpoint taken at position 0
// always does), then evaluation from its NTokens; none, from the start.
// Where memMin already serves the prefix (the memory can be cut there) it
// keeps the prefix and restores nothing.
func (r Rules) Find(list []*Checkpoint, n, prefix, memMin int) Resume {
	if prefix <= 0 {
		return Resume{}
	}
	hasNew := 0
	if prefix >= n {
		hasNew = 1
	}
	thold := max(0, prefix-r.NSWA-hasNew)
	if memMin < thold {
		return Resume{Keep: prefix, PosNext: prefix}
	}
	for i := len(list) - 1; i >= 0; i-- {
		c := list[i]
		if c.PosMax > prefix {
			continue
		}
		if c.PosMin < thold || c.PosMin == 0 {
			next := min(prefix, max(c.PosMin+1, c.PosMax))
			return Resume{Keep: min(next, c.NTokens), Restore: c, PosNext: next}
		}
	}
	return Resume{}
}

// List is one slot's checkpoints, oldest first.
type List struct {
	cps []*Checkpoint
}

// All is the checkpoints, oldest first; the slice is the list's own.
func (l *List) All() []*Checkpoint { return l.cps }

// Len is how many checkpoints the list holds.
func (l *List) Len() int { return len(l.cps) }

// Newest is the NTokens of the newest checkpoint; -1 for none.
func (l *List) Newest() int {
	if len(l.cps) == 0 {
		return -1
	}
	return l.cps[len(l.cps)-1].NTokens
}

// Bytes is the host memory the list holds.
func (l *List) Bytes() int64 {
	var n int64
	for _, c := range l.cps {
		n += c.Size()
	}
	return n
}

// Add appends c, first dropping the checkpoints of other prompts that lie
// within MinStep of an earlier one, then the oldest while the list is full.
// It returns what it dropped.
func (l *List) Add(r Rules, c *Checkpoint) (dropped []*Checkpoint) {
	last := -1
	l.cps = slices.DeleteFunc(l.cps, func(o *Checkpoint) bool {
		if o.Task != c.Task && last >= 0 && o.NTokens <= last+r.MinStep {
			dropped = append(dropped, o)
			return true
		}
		last = o.NTokens
		return false
	})
	for len(l.cps) > 0 && len(l.cps) >= r.Max {
		dropped = append(dropped, l.cps[0])
		l.cps = l.cps[1:]
	}
	l.cps = append(l.cps, c)
	return dropped
}

// After drops the checkpoints that end past position pos (the sequence was
// cut back there) and returns them.
func (l *List) After(pos int) (dropped []*Checkpoint) {
	l.cps = slices.DeleteFunc(l.cps, func(c *Checkpoint) bool {
		if c.PosMax > pos {
			dropped = append(dropped, c)
			return true
		}
		return false
	})
	return dropped
}

// Clear drops every checkpoint and returns them.
func (l *List) Clear() []*Checkpoint {
	d := l.cps
	l.cps = nil
	return d
}

// Remove drops c if the list holds it; false if not.
func (l *List) Remove(c *Checkpoint) bool {
	i := slices.Index(l.cps, c)
	if i < 0 {
		return false
	}
	l.cps = slices.Delete(l.cps, i, i+1)
	return true
}

// Oldest is the list's oldest checkpoint; nil when empty.
func (l *List) Oldest() *Checkpoint {
	if len(l.cps) == 0 {
		return nil
	}
	return l.cps[0]
}

// Delimiter is a chat template's message delimiter (common/chat's
// common_chat_msg_delimiter) as tokens: where a message of its role starts.
type Delimiter struct {
	User   bool // a user message's; others (assistant, tool, system) only end the one before
	Tokens []int32
}

// UserStarts finds where a prompt's user messages start, as llama-server
// splits a prompt by the template's delimiters: at each position the first
// delimiter (in the template's order: a tool result's before a user
// message's, where one begins like the other) whose tokens follow there
// names the message starting there.
func UserStarts(prompt []int32, delims []Delimiter) Spans {
	var s Spans
	for i := range prompt {
		for _, d := range delims {
			if len(d.Tokens) == 0 || i+len(d.Tokens) > len(prompt) || !slices.Equal(prompt[i:i+len(d.Tokens)], d.Tokens) {
				continue
			}
			if d.User {
				s.UserStarts = append(s.UserStarts, i)
			}
			break
		}
	}
	return s
}
