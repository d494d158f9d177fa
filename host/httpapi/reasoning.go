package httpapi

import "strings"

// reasoningSplitter splits a model's streamed text into reasoning (what it
// writes between its thinking markers) and content (the rest), the way
// llama-server's --reasoning-format deepseek fills reasoning_content and
// content. The rules follow llama.cpp's common/chat-parser.cpp
// (common_chat_msg_parser::try_parse_reasoning):
//
//   - a thinking block opens only at the start of the output, after
//     whitespace, which stays content; text before a start marker makes the
//     whole output content, since the model is not thinking;
//   - whitespace right after a start marker is dropped (llama.cpp strips
//     the reasoning);
//   - whitespace right after an end marker is dropped, and a start marker
//     there opens another block;
//   - with startsInside (the generation prompt already opened the block)
//     the output starts as reasoning, and a repeated start marker at its
//     start is dropped;
//   - a block never closed leaves all the rest reasoning.
//
// Unlike llama.cpp, whitespace before an end marker stays in the reasoning:
// stripping it would mean holding back whitespace, and the splitter holds
// back nothing but a possible marker prefix, so each piece shows at once.
type reasoningSplitter struct {
	start, end string
	state      splitState
	held       string // received, not yet classified: a proper prefix of a marker
}

type splitState int

const (
	splitHead       splitState = iota // output start: whitespace is content, a start marker opens a block
	splitInsideHead                   // output start inside a block: whitespace dropped, a start marker too
	splitBlockHead                    // just after a start marker: whitespace dropped
	splitBlock                        // reasoning, up to the end marker
	splitAfterBlock                   // just after an end marker: whitespace dropped, a start marker opens a block
	splitContent                      // everything else is content
)

// reasoningSpaces is what C's isspace accepts, the whitespace llama.cpp skips.
const reasoningSpaces = " \t\n\v\f\r"

// newReasoningSplitter returns a splitter for the markers, "<think>" and
// "</think>" where empty.
func newReasoningSplitter(start, end string, startsInside bool) *reasoningSplitter {
	if start == "" {
		start = "<think>"
	}
	if end == "" {
		end = "</think>"
	}
	s := &reasoningSplitter{start: start, end: end}
	if startsInside {
		s.state = splitInsideHead
	}
	return s
}

// Push adds a piece of output and returns what is now known to be reasoning
// and content. Within one call content follows reasoning, except whitespace
// before the output's first start marker.
func (s *reasoningSplitter) Push(piece string) (reasoning, content string) {
	s.held += piece
	var r, c strings.Builder
	for s.held != "" {
		if !s.step(&r, &c) {
			break
		}
	}
	return r.String(), c.String()
}

// Flush ends the stream and returns what was held back: a marker's
// beginning that never completed is text of the part it appeared in.
func (s *reasoningSplitter) Flush() (reasoning, content string) {
	held := s.held
	s.held = ""
	if s.state == splitBlock || s.state == splitInsideHead {
		return held, ""
	}
	return "", held
}

// step classifies the front of held; false when held is empty or must wait
// for more text.
func (s *reasoningSplitter) step(r, c *strings.Builder) bool {
	switch s.state {
	case splitContent:
		c.WriteString(s.held)
		s.held = ""
		return false
	case splitBlock:
		return s.stepBlock(r)
	}
	return s.stepHead(c)
}

// stepBlock passes reasoning up to the end marker, holding back a tail that
// may be the marker's beginning.
func (s *reasoningSplitter) stepBlock(r *strings.Builder) bool {
	if i := strings.Index(s.held, s.end); i >= 0 {
		r.WriteString(s.held[:i])
		s.held = s.held[i+len(s.end):]
		s.state = splitAfterBlock
		return true
	}
	keep := len(s.held) - markerPrefixTail(s.held, s.end)
	r.WriteString(s.held[:keep])
	s.held = s.held[keep:]
	return false
}

// stepHead handles the states where whitespace and a start marker may come
// before the text that decides what follows.
func (s *reasoningSplitter) stepHead(c *strings.Builder) bool {
	rest := strings.TrimLeft(s.held, reasoningSpaces)
	if s.state == splitHead {
		c.WriteString(s.held[:len(s.held)-len(rest)])
	}
	s.held = rest
	switch {
	case rest == "":
		return false
	case s.state == splitBlockHead:
		s.state = splitBlock
	case strings.HasPrefix(rest, s.start):
		s.held = rest[len(s.start):]
		s.state = splitBlockHead
	case strings.HasPrefix(s.start, rest):
		return false // may still become the start marker
	case s.state == splitInsideHead:
		s.state = splitBlock
	default:
		s.state = splitContent
	}
	return true
}

// markerPrefixTail is the length of the longest end of s that is a proper prefix
// of marker.
func markerPrefixTail(s, marker string) int {
	for k := min(len(marker)-1, len(s)); k > 0; k-- {
		if strings.HasSuffix(s, marker[:k]) {
			return k
		}
	}
	return 0
}
