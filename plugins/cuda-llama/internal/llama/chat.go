//go:build llama && cgo

package llama

/*
#include <stdlib.h>
#include <string.h>
#include "chatcommon.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// commonString takes a string chatcommon.cpp malloc'd ("" for NULL).
func commonString(s *C.char) string {
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// commonBytes takes a JSON text chatcommon.cpp malloc'd.
func commonBytes(s *C.char) []byte {
	defer C.free(unsafe.Pointer(s))
	return C.GoBytes(unsafe.Pointer(s), C.int(C.strlen(s)))
}

// Chat is a model's chat templates in llama.cpp's common library
// (common/chat), which decides a chat reply's format, grammar and parser as
// llama-server does.
type Chat struct{ p *C.hydra_chat }

// NewChat loads the model's chat templates (tmpl: an override, "" for the
// model's own, ChatML without one), as common_chat_templates_init.
func NewChat(m Model, tmpl string) (*Chat, error) {
	ct := C.CString(tmpl)
	defer C.free(unsafe.Pointer(ct))
	var cerr *C.char
	c := C.hydra_chat_new(m.p, ct, &cerr)
	if c == nil {
		return nil, errors.New(commonString(cerr))
	}
	return &Chat{p: c}, nil
}

// Free releases the templates.
func (c *Chat) Free() { C.hydra_chat_free(c.p) }

// Source is the default template's source, as llama-server's /props reports
// it.
func (c *Chat) Source() string { return commonString(C.hydra_chat_source(c.p)) }

// Apply is common_chat_templates_apply for req, a JSON object with
// llama-server's chat fields (messages, tools, tool_choice,
// parallel_tool_calls, json_schema, grammar, chat_template_kwargs): the
// rendered prompt, its format, grammar and triggers, parser and stops, as a
// JSON object (chatcommon.h); an error names what is invalid in req.
func (c *Chat) Apply(req []byte) ([]byte, error) {
	cr := C.CString(string(req))
	defer C.free(unsafe.Pointer(cr))
	var cerr *C.char
	out := C.hydra_chat_apply(c.p, cr, &cerr)
	if out == nil {
		return nil, errors.New(commonString(cerr))
	}
	return commonBytes(out), nil
}

// ChatParser is one reply's parser, made from an Apply result's format and
// parser; used by one goroutine at a time.
type ChatParser struct{ p *C.hydra_chat_parser }

// NewChatParser reads a parser from params, a JSON object
// {"format","generation_prompt","parser"} of an Apply result.
func NewChatParser(params []byte) (*ChatParser, error) {
	cs := C.CString(string(params))
	defer C.free(unsafe.Pointer(cs))
	var cerr *C.char
	p := C.hydra_chat_parser_new(cs, &cerr)
	if p == nil {
		return nil, errors.New(commonString(cerr))
	}
	return &ChatParser{p: p}, nil
}

// Free releases the parser.
func (p *ChatParser) Free() { C.hydra_chat_parser_free(p.p) }

// Add appends text to the reply and parses all of it (partial: more may
// come), as llama-server's update_chat_msg: the parsed message and the diffs
// from the last parse, as JSON {"msg":{...},"diffs":[...]}; an error when a
// final parse fails.
func (p *ChatParser) Add(text string, partial bool) ([]byte, error) {
	ct := C.CString(text) // C memory: cgo passes no Go pointer to a string's bytes
	defer C.free(unsafe.Pointer(ct))
	var cerr *C.char
	cp := C.int(0)
	if partial {
		cp = 1
	}
	out := C.hydra_chat_parser_add(p.p, ct, C.size_t(len(text)), cp, &cerr)
	if out == nil {
		return nil, errors.New(commonString(cerr))
	}
	return commonBytes(out), nil
}
