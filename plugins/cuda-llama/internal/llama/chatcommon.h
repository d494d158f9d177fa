// C interface of chatcommon.cpp: llama.cpp's common library (common/chat,
// common/json-schema-to-grammar) as llama-server uses it, for the chat
// formats, tool-call grammars and reply parsing. Plain C over JSON text, so
// cgo can call it; every char * returned is malloc'd and the caller frees it.
#pragma once

#include <stddef.h>

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hydra_chat hydra_chat;
typedef struct hydra_chat_parser hydra_chat_parser;

// hydra_chat_new loads the model's chat templates (tmpl: an override, "" for
// the model's own, ChatML without one), as common_chat_templates_init. NULL
// with *err on failure.
hydra_chat * hydra_chat_new(const struct llama_model * model, const char * tmpl, char ** err);
void hydra_chat_free(hydra_chat * c);

// hydra_chat_source is the default template's source, as llama-server's
// /props reports it (common_chat_templates_source).
char * hydra_chat_source(const hydra_chat * c);

// hydra_chat_apply is common_chat_templates_apply for req, a JSON object with
// llama-server's chat fields (messages, tools, tool_choice,
// parallel_tool_calls, json_schema, grammar, chat_template_kwargs): the
// rendered prompt, its format, grammar and triggers, parser and stops, as a
// JSON object. NULL with *err when the request is invalid.
char * hydra_chat_apply(const hydra_chat * c, const char * req, char ** err);

// hydra_chat_parser_new reads a parser from a hydra_chat_apply result.
hydra_chat_parser * hydra_chat_parser_new(const char * params, char ** err);
void hydra_chat_parser_free(hydra_chat_parser * p);

// hydra_chat_parser_add appends n bytes of generated text and parses all of
// it (partial: more may come), as llama-server's update_chat_msg: the parsed
// message and the diffs from the last parse, as JSON
// {"msg":{...},"diffs":[...]}. NULL with *err when a final parse fails.
char * hydra_chat_parser_add(hydra_chat_parser * p, const char * text, size_t n, int partial, char ** err);

// hydra_json_schema_grammar is the GBNF of a JSON schema (JSON text), as
// llama-server's json_schema field. NULL with *err for an invalid schema.
char * hydra_json_schema_grammar(const char * schema, char ** err);

// hydra_grammar_check parses a GBNF grammar: NULL when it is valid, else the
// parser's error (malloc'd).
char * hydra_grammar_check(const char * grammar);

// hydra_grammar_new builds the grammar sampler for spec, a JSON object
// {"grammar","lazy","triggers":[{"type","value","token"}],"prefill"}: lazy
// grammars wait for a trigger, as common_sampler_init builds them; prefill
// is text already in the prompt (the generation prompt) the grammar starts
// after. NULL with *err when the grammar cannot be built.
struct llama_sampler * hydra_grammar_new(const struct llama_vocab * vocab, const char * spec, char ** err);

// hydra_reasoning_budget_new builds llama.cpp's reasoning-budget sampler
// (common_reasoning_budget_init) for spec, a JSON object
// {"start","ends":[…],"message","budget","prefill"}, as common_sampler_init
// builds it from llama-server's reasoning_budget_* fields: the tags and the
// message tokenized with special tokens parsed, the message and the first
// end tag forced when the budget runs out, a negative budget unbounded, and
// the generation prompt (prefill) accepted first, so that a prompt which
// opens the reasoning starts the count, from its start tag (llama-server
// counts the prompt's tokens after the tag too). NULL with *err on failure.
struct llama_sampler * hydra_reasoning_budget_new(const struct llama_vocab * vocab, const char * spec, char ** err);

#ifdef __cplusplus
}
#endif
