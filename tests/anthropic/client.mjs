// The engine's /v1/messages driven by the official Anthropic Node SDK, as an
// agent drives it: node client.mjs BASE_URL prints one JSON object of what
// each scenario got back, for tests/llama_anthropic_test.go to judge. Any
// SDK error is printed as {"error": …} with the failing scenario, and exits 1.
import Anthropic from "@anthropic-ai/sdk";

const client = new Anthropic({ baseURL: process.argv[2], apiKey: "none", maxRetries: 0 });

const tools = [
  {
    name: "get_weather",
    description: "The weather in a city",
    // Bounded strings: random weights write a string as long as they may.
    input_schema: { type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"] },
  },
];
const user = { role: "user", content: "What is the weather in Paris?" };
const base = { model: "tiny", max_tokens: 400, temperature: 1, system: [{ type: "text", text: "You are a weather bot." }] };
const out = {};
let step = "";

try {
  // A tool round trip: a named call, its result, the next turn.
  step = "call";
  const call = { ...base, messages: [user], tools, tool_choice: { type: "tool", name: "get_weather" } };
  const first = await client.messages.create(call);
  out.call = first;
  step = "count_tokens";
  const { model, messages, system, tool_choice } = call;
  out.count = await client.messages.countTokens({ model, messages, system, tools, tool_choice });
  step = "next turn";
  const use = first.content.find((b) => b.type === "tool_use");
  out.next = await client.messages.create({
    ...base,
    max_tokens: 8,
    messages: [
      user,
      { role: "assistant", content: first.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: '{"sky":"clear"}' }] }] },
    ],
    tools,
    tool_choice: { type: "none" },
  });

  // A required call streamed: the SDK rebuilds the message from the events.
  step = "stream";
  const stream = client.messages.stream({ ...base, messages: [user], tools, tool_choice: { type: "any" } });
  const events = [];
  stream.on("streamEvent", (e) => events.push(e.type));
  const done = await stream.finalMessage();
  out.stream = { events, message: done };

  // Bad input: the SDK raises the 400, the field named in its message.
  step = "bad tool_choice";
  try {
    await client.messages.create({ ...base, messages: [user], tools, tool_choice: { type: "tool", name: "nope" } });
    out.bad = { status: 200 };
  } catch (e) {
    out.bad = { status: e.status, type: e.error?.error?.type, message: e.error?.error?.message };
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ step, error: String(e), status: e.status, got: out }));
  process.exit(1);
}
