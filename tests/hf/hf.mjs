// hf.mjs answers, with Hugging Face's own JavaScript implementations
// (@huggingface/tokenizers, the tokenizer transformers.js runs, and
// @huggingface/jinja, its chat-template engine), what a Hugging Face
// tokenizer makes of some input, so that Go tests can hold llama.cpp's
// tokenizer and our templates against it (internal/hfref runs it).
//
//	node hf.mjs encode   DIR   < {"texts": [...], "add_special_tokens": true}
//	                           > {"ids": [[...], ...]}
//	node hf.mjs render   DIR   < {"messages": [...], "tools": [...], "add_generation_prompt": true, "kwargs": {...}}
//	                           > {"text": "..."}
//	node hf.mjs added    DIR   > {"tokens": [{"id", "content", "special", "roundtrip"}, ...]}
//
// DIR holds tokenizer.json and tokenizer_config.json as Hugging Face ships
// them. Requests come as one JSON object on standard input, answers as one
// JSON object on standard output; an error is a message on standard error
// and exit status 1.
import { readFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";

const [cmd, dir] = process.argv.slice(2);
if (!cmd || !dir) {
  fail("usage: node hf.mjs encode|render|added TOKENIZER_DIR < request.json");
}

function fail(msg) {
  process.stderr.write(`hf.mjs: ${msg}\n`);
  process.exit(1);
}

function readJSON(path, optional) {
  if (optional && !existsSync(path)) return {};
  return JSON.parse(readFileSync(path, "utf8"));
}

function readRequest() {
  const text = readFileSync(0, "utf8");
  return text.trim() === "" ? {} : JSON.parse(text);
}

const tokenizerJSON = readJSON(join(dir, "tokenizer.json"));
const config = readJSON(join(dir, "tokenizer_config.json"), true);
const tokenizer = new Tokenizer(tokenizerJSON, config);

// A special token of tokenizer_config.json is a string or an AddedToken
// object; templates see its text.
function tokenText(v) {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof v.content === "string") return v.content;
  return undefined;
}

// The chat template transformers.js would pick: tokenizer_config.json's
// (a string, or named templates of which "tool_use" serves requests with
// tools and "default" the rest), else chat_template.jinja beside it.
function chatTemplate(tools) {
  let t = config.chat_template;
  if (Array.isArray(t)) {
    const named = Object.fromEntries(t.map((x) => [x.name, x.template]));
    t = (tools && named.tool_use) || named.default;
  }
  if (typeof t !== "string" && existsSync(join(dir, "chat_template.jinja"))) {
    t = readFileSync(join(dir, "chat_template.jinja"), "utf8");
  }
  if (typeof t !== "string") fail(`${dir} has no chat template`);
  return t;
}

const req = cmd === "added" ? {} : readRequest();
let out;
switch (cmd) {
  case "encode": {
    const add = req.add_special_tokens ?? true; // Hugging Face's default
    out = { ids: (req.texts ?? []).map((t) => tokenizer.encode(t, { add_special_tokens: add }).ids) };
    break;
  }
  case "render": {
    const vars = {};
    for (const key of ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]) {
      const v = tokenText(config[key]);
      if (v) vars[key] = v;
    }
    const tools = req.tools ?? null;
    const text = new Template(chatTemplate(tools)).render({
      messages: req.messages ?? [],
      tools,
      documents: req.documents ?? null,
      add_generation_prompt: req.add_generation_prompt ?? false,
      ...vars,
      ...(req.kwargs ?? {}),
    });
    out = { text };
    break;
  }
  case "added": {
    // What convert_hf_to_gguf.py stores for a non-normalized added token:
    // the token encoded and decoded back.
    out = {
      tokens: (tokenizerJSON.added_tokens ?? []).map((t) => ({
        id: t.id,
        content: t.content,
        special: t.special,
        roundtrip: tokenizer.decode(tokenizer.encode(t.content, { add_special_tokens: false }).ids, {
          skip_special_tokens: false,
          clean_up_tokenization_spaces: config.clean_up_tokenization_spaces ?? false,
        }),
      })),
    };
    break;
  }
  default:
    fail(`unknown command ${cmd}: want encode, render or added`);
}
process.stdout.write(JSON.stringify(out) + "\n");
