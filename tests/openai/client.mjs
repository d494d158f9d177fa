// The engine's HTTP API driven by the official OpenAI Node SDK, as an agent
// drives it: node client.mjs BASE_URL prints one JSON object of what each
// scenario got back, for tests/llama_openai_test.go to judge. Any SDK error
// is printed as {"error": …} with the failing scenario, and exits 1.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "none", maxRetries: 0 });

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      // Bounded strings: random weights write a string as long as they may.
      parameters: { type: "object", properties: { city: { type: "string", maxLength: 16 } }, required: ["city"] },
    },
  },
];
const user = { role: "user", content: "What is the weather in Paris?" };
const sampling = { temperature: 1, seed: 11, max_tokens: 400 };
const out = {};
let step = "";

try {
  // A tool round trip: a required call, its result, the next turn.
  step = "call";
  const first = await client.chat.completions.create({ model: "tiny", messages: [user], tools, tool_choice: "required", ...sampling });
  out.call = { finish_reason: first.choices[0].finish_reason, message: first.choices[0].message };
  step = "next turn";
  const call = first.choices[0].message.tool_calls[0];
  const next = await client.chat.completions.create({
    model: "tiny",
    messages: [user, first.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"sky":"clear"}' }],
    tools,
    tool_choice: "none",
    ...sampling,
    max_tokens: 8,
  });
  out.next = { finish_reason: next.choices[0].finish_reason, message: next.choices[0].message };

  // The same call streamed: the SDK reassembles the deltas.
  step = "stream";
  const stream = client.chat.completions.stream({
    model: "tiny",
    messages: [user],
    tools,
    tool_choice: { type: "function", function: { name: "get_weather" } },
    ...sampling,
  });
  let chunks = 0;
  stream.on("chunk", () => chunks++);
  const done = await stream.finalChatCompletion();
  out.stream = { chunks, finish_reason: done.choices[0].finish_reason, message: done.choices[0].message };

  // A json_schema reply, parsed by the SDK's own helper.
  step = "response_format";
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 12 }, n: { type: "integer" } },
    required: ["name", "n"],
    additionalProperties: false,
  };
  const parsed = await client.chat.completions.parse({
    model: "tiny",
    messages: [{ role: "user", content: "A name and a number." }],
    response_format: { type: "json_schema", json_schema: { name: "pair", schema, strict: true } },
    ...sampling,
  });
  out.response_format = { finish_reason: parsed.choices[0].finish_reason, parsed: parsed.choices[0].message.parsed };

  // Bad input: the SDK raises the 400 with the field named.
  step = "bad tool_choice";
  try {
    await client.chat.completions.create({ model: "tiny", messages: [user], tools, tool_choice: { type: "function", function: { name: "nope" } } });
    out.bad = { status: 200 };
  } catch (e) {
    out.bad = { status: e.status, param: e.param, message: e.message };
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ step, error: String(e), status: e.status, got: out }));
  process.exit(1);
}
