//go:build llama && cgo

// llama.cpp's common library as llama-server calls it (tools/server's
// oaicompat_chat_params_parse, task_result_state::update_chat_msg and
// common_sampler_init's grammar), behind a C interface of JSON text: the
// chat formats, tool-call grammars and reply parsers stay llama.cpp's.

#include "chatcommon.h"

#include "chat.h"
#include "common.h"
#include "json-schema-to-grammar.h"
#include "llama-grammar.h"
#include "reasoning-budget.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

struct hydra_chat {
    common_chat_templates_ptr tmpls;
};

struct hydra_chat_parser {
    common_chat_parser_params params;
    std::string text;
    common_chat_msg msg;
    std::vector<std::string> ids;  // the tool calls' ids, kept across parses
};

namespace {

char * dup(const std::string & s) {
    char * out = (char *) std::malloc(s.size() + 1);
    if (out != nullptr) {
        std::memcpy(out, s.data(), s.size());
        out[s.size()] = 0;
    }
    return out;
}

void set_err(char ** err, const std::string & s) {
    if (err != nullptr) {
        *err = dup(s);
    }
}

// tool_call_id is a new call's id, as llama-server's gen_tool_call_id: 32
// random letters and digits.
std::string tool_call_id() {
    static const char chars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<size_t> pick(0, sizeof(chars) - 2);
    std::string s(32, ' ');
    for (auto & c : s) {
        c = chars[pick(rng)];
    }
    return s;
}

// prefill_tokens are the generation prompt's tokens as common_sampler_init
// feeds them to its grammar and reasoning budget: special tokens parsed, and
// a first token skipped that is only the space some tokenizers put before
// the first special token.
std::vector<llama_token> prefill_tokens(const llama_vocab * vocab, const std::string & prefill) {
    std::vector<llama_token> out;
    if (prefill.empty()) {
        return out;
    }
    auto toks = common_tokenize(vocab, prefill, false, true);
    for (size_t i = 0; i < toks.size(); i++) {
        const auto piece = common_token_to_piece(vocab, toks[i], true);
        if (i == 0 && !piece.empty() && std::isspace((unsigned char) piece[0]) && !std::isspace((unsigned char) prefill[0])) {
            continue;
        }
        out.push_back(toks[i]);
    }
    return out;
}

// find_seq is the index of the first occurrence of seq in toks at or after
// from, or toks.size().
size_t find_seq(const std::vector<llama_token> & toks, const llama_tokens & seq, size_t from) {
    if (seq.empty()) {
        return toks.size();
    }
    for (size_t i = from; i + seq.size() <= toks.size(); i++) {
        if (std::equal(seq.begin(), seq.end(), toks.begin() + i)) {
            return i;
        }
    }
    return toks.size();
}

// budget_prefill is the part of the generation prompt's tokens a reasoning
// budget takes: all of them, unless they leave a reasoning block open; then
// those up to its start tag, since what the prompt has after the tag (the
// newline a thinking template writes) is no reasoning the reply spent.
std::vector<llama_token> budget_prefill(std::vector<llama_token> toks, const llama_tokens & start,
                                        const std::vector<llama_tokens> & ends) {
    size_t open = toks.size();
    for (size_t i = find_seq(toks, start, 0); i < toks.size(); i = find_seq(toks, start, i + 1)) {
        open = i + start.size();
    }
    if (open == toks.size()) {
        return toks;  // no block opens, or it opens at the very end
    }
    for (const auto & end : ends) {
        if (find_seq(toks, end, open) < toks.size()) {
            return toks;  // the prompt closed the block again
        }
    }
    toks.resize(open);
    return toks;
}

common_json diff_json(const common_chat_msg_diff & d) {
    common_json j = common_json::object();
    j["reasoning_content"] = d.reasoning_content_delta;
    j["content"] = d.content_delta;
    j["index"] = d.tool_call_index == std::string::npos ? -1 : (int64_t) d.tool_call_index;
    j["id"] = d.tool_call_delta.id;
    j["name"] = d.tool_call_delta.name;
    j["arguments"] = d.tool_call_delta.arguments;
    return j;
}

}  // namespace

extern "C" {

hydra_chat * hydra_chat_new(const llama_model * model, const char * tmpl, char ** err) {
    try {
        auto * c = new hydra_chat;
        c->tmpls = common_chat_templates_init(model, tmpl != nullptr ? tmpl : "");
        return c;
    } catch (const std::exception & e) {
        set_err(err, e.what());
    }
    return nullptr;
}

void hydra_chat_free(hydra_chat * c) { delete c; }

char * hydra_chat_source(const hydra_chat * c) {
    try {
        return dup(common_chat_templates_source(c->tmpls.get()));
    } catch (...) {
        return dup("");
    }
}

char * hydra_chat_apply(const hydra_chat * c, const char * req_text, char ** err) {
    try {
        const auto req = common_json::parse(req_text);
        common_chat_templates_inputs in;
        in.messages = common_chat_msgs_parse_oaicompat(req.at("messages"));
        if (req.contains("tools")) {
            in.tools = common_chat_tools_parse_oaicompat(req.at("tools"));
        }
        in.tool_choice = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
        if (req.contains("json_schema")) {
            in.json_schema = req.at("json_schema").dump();
        }
        in.grammar = req.value("grammar", std::string());
        in.use_jinja = true;
        auto caps = common_chat_templates_get_caps(c->tmpls.get());
        in.parallel_tool_calls = req.value("parallel_tool_calls", (bool) caps["supports_parallel_tool_calls"]);
        in.add_generation_prompt = true;
        in.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;  // llama-server's default
        if (req.contains("chat_template_kwargs")) {
            for (const auto & kv : req.at("chat_template_kwargs").items()) {
                in.chat_template_kwargs[kv.key()] = kv.value().dump();
            }
        }
        // enable_thinking in the kwargs sets llama-server's reasoning switch.
        auto et = in.chat_template_kwargs.find("enable_thinking");
        if (et != in.chat_template_kwargs.end()) {
            if (et->second == "true" || et->second == "false") {
                in.enable_thinking = et->second == "true";
            } else {
                throw std::invalid_argument("chat_template_kwargs.enable_thinking must be a boolean");
            }
        }
        const auto p = common_chat_templates_apply(c->tmpls.get(), in);
        common_json out = common_json::object();
        out["prompt"] = p.prompt;
        out["format"] = (int64_t) p.format;
        out["format_name"] = std::string(common_chat_format_name(p.format));
        out["grammar"] = p.grammar;
        out["grammar_lazy"] = p.grammar_lazy;
        out["generation_prompt"] = p.generation_prompt;
        out["parser"] = p.parser;
        out["thinking_start_tag"] = p.thinking_start_tag;
        out["thinking_end_tags"] = p.thinking_end_tags;
        auto triggers = common_json::array();
        for (const auto & t : p.grammar_triggers) {
            common_json tj = common_json::object();
            tj["type"] = (int64_t) t.type;
            tj["value"] = t.value;
            tj["token"] = (int64_t) t.token;
            triggers.push_back(tj);
        }
        out["grammar_triggers"] = triggers;
        auto preserved = common_json::array();
        for (const auto & t : p.preserved_tokens) {
            preserved.push_back(t);
        }
        out["preserved_tokens"] = preserved;
        out["message_delimiters"] = p.message_delimiters.to_json();
        auto stops = common_json::array();
        for (const auto & s : p.additional_stops) {
            stops.push_back(s);
        }
        out["additional_stops"] = stops;
        return dup(out.dump());
    } catch (const std::exception & e) {
        set_err(err, e.what());
    }
    return nullptr;
}

hydra_chat_parser * hydra_chat_parser_new(const char * params_text, char ** err) {
    try {
        const auto j = common_json::parse(params_text);
        auto * p = new hydra_chat_parser;
        p->params.format = (common_chat_format) j.at("format").get<int64_t>();
        p->params.generation_prompt = j.value("generation_prompt", std::string());
        p->params.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
        p->params.parse_tool_calls = j.value("parse_tool_calls", true);
        const auto parser = j.value("parser", std::string());
        if (!parser.empty()) {
            p->params.parser.load(parser);
        }
        return p;
    } catch (const std::exception & e) {
        set_err(err, e.what());
    }
    return nullptr;
}

void hydra_chat_parser_free(hydra_chat_parser * p) { delete p; }

char * hydra_chat_parser_add(hydra_chat_parser * p, const char * text, size_t n, int partial, char ** err) {
    try {
        p->text.append(text, n);
        auto diffs = common_json::array();
        common_chat_msg next;
        try {
            next = common_chat_parse(p->text, partial != 0, p->params);
        } catch (const std::exception & e) {
            if (!partial) {
                throw;
            }
            next = common_chat_msg{};  // a partial parse that fails says nothing yet
        }
        if (!next.empty()) {
            next.set_tool_call_ids(p->ids, tool_call_id);
            std::vector<common_chat_msg_diff> ds;
            try {
                ds = common_chat_msg_diff::compute_diffs(p->msg, next);
            } catch (const std::exception &) {
                // A parse that takes back what an earlier one found (fewer
                // calls, a renamed call): a partial one waits for more
                // text; the final one stands, as the reply, without diffs.
                if (partial) {
                    ds.clear();
                    next = p->msg;
                }
            }
            for (const auto & d : ds) {
                diffs.push_back(diff_json(d));
            }
            p->msg = next;
        }
        common_json out = common_json::object();
        out["msg"] = p->msg.to_json_oaicompat();
        out["diffs"] = diffs;
        return dup(out.dump());
    } catch (const std::exception & e) {
        set_err(err, e.what());
    }
    return nullptr;
}

char * hydra_json_schema_grammar(const char * schema, char ** err) {
    try {
        return dup(json_schema_to_grammar(common_json::parse(schema)));
    } catch (const std::exception & e) {
        set_err(err, e.what());
    }
    return nullptr;
}

char * hydra_grammar_check(const char * grammar) {
    // llama_grammar_parser::parse prints its error; this is its loop, keeping it.
    llama_grammar_parser parser;
    try {
        const char * pos = grammar;
        auto space = [](const char * s) {
            while (*s == ' ' || *s == '\t' || *s == '#' || *s == '\r' || *s == '\n') {
                if (*s == '#') {
                    while (*s && *s != '\r' && *s != '\n') {
                        s++;
                    }
                } else {
                    s++;
                }
            }
            return s;
        };
        pos = space(pos);
        while (*pos) {
            pos = parser.parse_rule(pos);
        }
        for (const auto & rule : parser.rules) {
            if (rule.empty()) {
                throw std::runtime_error("undefined rule");
            }
            for (const auto & elem : rule) {
                if (elem.type == LLAMA_GRETYPE_RULE_REF && (elem.value >= parser.rules.size() || parser.rules[elem.value].empty())) {
                    for (const auto & kv : parser.symbol_ids) {
                        if (kv.second == elem.value) {
                            throw std::runtime_error("undefined rule identifier '" + kv.first + "'");
                        }
                    }
                    throw std::runtime_error("undefined rule");
                }
            }
        }
        if (parser.symbol_ids.find("root") == parser.symbol_ids.end()) {
            throw std::runtime_error("no root rule");
        }
    } catch (const std::exception & e) {
        return dup(e.what());
    }
    return nullptr;
}

llama_sampler * hydra_grammar_new(const llama_vocab * vocab, const char * spec_text, char ** err) {
    llama_sampler * g = nullptr;
    try {
        const auto spec = common_json::parse(spec_text);
        const auto grammar = spec.at("grammar").get<std::string>();
        const bool lazy = spec.value("lazy", false);
        std::vector<std::string> patterns;
        std::vector<llama_token> tokens;
        if (spec.contains("triggers")) {
            for (const auto & t : spec.at("triggers")) {
                const auto type = (common_grammar_trigger_type) t.at("type").get<int64_t>();
                const auto value = t.value("value", std::string());
                switch (type) {
                    case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:
                        patterns.push_back(regex_escape(value));
                        break;
                    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
                        patterns.push_back(value);
                        break;
                    case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL:
                        patterns.push_back(value.empty() ? "^$" :
                                           (value.front() != '^' ? "^" : "") + value + (value.back() != '$' ? "$" : ""));
                        break;
                    case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:
                        tokens.push_back((llama_token) t.at("token").get<int64_t>());
                        break;
                }
            }
        }
        std::vector<const char *> pc;
        for (const auto & s : patterns) {
            pc.push_back(s.c_str());
        }
        g = lazy ? llama_sampler_init_grammar_lazy_patterns(vocab, grammar.c_str(), "root", pc.data(), pc.size(),
                                                            tokens.data(), tokens.size()) :
                   llama_sampler_init_grammar(vocab, grammar.c_str(), "root");
        if (g == nullptr) {
            char * why = hydra_grammar_check(grammar.c_str());
            set_err(err, why != nullptr ? why : "the grammar cannot be used (left recursion?)");
            std::free(why);
            return nullptr;
        }
        // The generation prompt is in the prompt already: a tool-call or
        // output-format grammar starts after it, as common_sampler_init
        // feeds it (skipping a space some tokenizers put before the first
        // special token).
        if (!lazy) {
            for (const auto tok : prefill_tokens(vocab, spec.value("prefill", std::string()))) {
                llama_sampler_accept(g, tok);
            }
        }
        return g;
    } catch (const std::exception & e) {
        if (g != nullptr) {
            llama_sampler_free(g);
        }
        set_err(err, e.what());
    }
    return nullptr;
}

llama_sampler * hydra_reasoning_budget_new(const llama_vocab * vocab, const char * spec_text, char ** err) {
    llama_sampler * rb = nullptr;
    try {
        const auto spec = common_json::parse(spec_text);
        const auto start = common_tokenize(vocab, spec.at("start").get<std::string>(), false, true);
        std::vector<llama_tokens> ends;
        for (const auto & t : spec.at("ends")) {
            const auto tag = t.get<std::string>();
            if (!tag.empty()) {
                ends.push_back(common_tokenize(vocab, tag, false, true));
            }
        }
        if (start.empty() || ends.empty()) {
            throw std::invalid_argument("a reasoning budget needs a start tag and an end tag");
        }
        // The forced sequence is the message, then the first end tag, as
        // llama-server's reasoning_budget_message field makes it.
        llama_tokens forced;
        const auto message = spec.value("message", std::string());
        if (!message.empty()) {
            forced = common_tokenize(vocab, message, false, true);
        }
        forced.insert(forced.end(), ends.front().begin(), ends.front().end());
        const auto budget = spec.at("budget").get<int64_t>();
        rb = common_reasoning_budget_init(vocab, {start}, ends, forced, budget < 0 ? INT_MAX : (int32_t) budget);
        for (const auto tok : budget_prefill(prefill_tokens(vocab, spec.value("prefill", std::string())), start, ends)) {
            llama_sampler_accept(rb, tok);
        }
        return rb;
    } catch (const std::exception & e) {
        if (rb != nullptr) {
            llama_sampler_free(rb);
        }
        set_err(err, e.what());
    }
    return nullptr;
}

}  // extern "C"
