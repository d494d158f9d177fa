// The engine's thinking budget (thinking.budget_tokens) driven by the
// official Anthropic Node SDK: node thinking.mjs BASE_URL prints one JSON
// object of what each scenario got back, for
// tests/llama_anthropic_test.go's TestLlamaAnthropicThinkingBudget to judge.
// The engine's template opens the reasoning in the generation prompt, so a
// reply reasons until its budget ends it. Any SDK error but the expected
// 400s is printed as {"error": …} with the failing scenario, and exits 1.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0 });

const base = { model: "tiny", max_tokens: 48, temperature: 1, messages: [{ role: "user", content: "Think, then say hello." }] };
const out = {};
let step = "";

// streamed runs a request as a stream: the content_block_delta types in
// order, and the message the SDK rebuilds from the events.
async function streamed(req) {
  const stream = client.messages.stream(req);
  const deltas = [];
  stream.on("streamEvent", (e) => {
    if (e.type === "content_block_delta") deltas.push(e.delta.type);
  });
  return { deltas, message: await stream.finalMessage() };
}

try {
  step = "budget 8";
  out.budget = await client.messages.create({ ...base, thinking: { type: "enabled", budget_tokens: 8 } });
  // A budget max_tokens reaches first bounds nothing: the reply reasons on.
  step = "budget past max_tokens";
  out.unbounded = await client.messages.create({ ...base, thinking: { type: "enabled", budget_tokens: 1024 } });
  step = "budget 5 streamed";
  out.five = await streamed({ ...base, thinking: { type: "enabled", budget_tokens: 5 } });
  step = "budget 0 streamed";
  out.zero = await streamed({ ...base, thinking: { type: "enabled", budget_tokens: 0 } });

  // Bad budgets: the SDK raises the 400, the field named in its message.
  step = "bad budgets";
  out.bad = [];
  for (const budget_tokens of [-3, 2.5]) {
    try {
      await client.messages.create({ ...base, thinking: { type: "enabled", budget_tokens } });
      out.bad.push({ status: 200 });
    } catch (e) {
      out.bad.push({ status: e.status, type: e.error?.error?.type, message: e.error?.error?.message });
    }
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ step, error: String(e), status: e.status, got: out }));
  process.exit(1);
}
