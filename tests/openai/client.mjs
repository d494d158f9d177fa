// The engine's HTTP API driven by the official OpenAI Node SDK, as an agent
// drives it (chat completions and the Responses API): node client.mjs
// BASE_URL prints one JSON object of what each scenario got back, for
// tests/llama_openai_test.go to judge. Any SDK error is printed as
// {"error": …} with the failing scenario, and exits 1.
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

  // The Responses API: a plain reply (the SDK's output_text), the same
  // streamed and rebuilt by the SDK from its events (seed is llama-server's
  // field, which its Responses API passes on).
  step = "responses";
  const brief = { model: "tiny", instructions: "Be brief.", input: "Say hello.", max_output_tokens: 8, temperature: 1, seed: 11 };
  const plain = await client.responses.create(brief);
  out.responses = { status: plain.status, output: plain.output, output_text: plain.output_text, usage: plain.usage };
  step = "responses stream";
  const rs = client.responses.stream(brief);
  const events = [];
  let snapshot = "";
  rs.on("event", (e) => events.push(e.type));
  rs.on("response.output_text.delta", (e) => (snapshot = e.snapshot));
  const rsFinal = await rs.finalResponse();
  out.responses_stream = { events, snapshot, output: rsFinal.output };

  // A tool round trip in Responses items: a required call streamed (its
  // arguments rebuilt by the SDK), its output, the next turn.
  step = "responses call";
  const rtools = [{ type: "function", name: "get_weather", description: "The weather in a city", parameters: tools[0].function.parameters }];
  const ask = { role: "user", content: [{ type: "input_text", text: "What is the weather in Paris?" }] };
  const cs = client.responses.stream({ model: "tiny", input: [ask], tools: rtools, tool_choice: "required", temperature: 1, seed: 11, max_output_tokens: 400 });
  let argsSnapshot = "";
  cs.on("response.function_call_arguments.delta", (e) => (argsSnapshot = e.snapshot));
  const rcall = await cs.finalResponse();
  out.responses_call = { status: rcall.status, output: rcall.output, snapshot: argsSnapshot };
  step = "responses next turn";
  const fc = rcall.output.find((o) => o.type === "function_call");
  const fcItem = { type: "function_call", id: fc.id, call_id: fc.call_id, name: fc.name, arguments: fc.arguments, status: fc.status };
  const rnext = await client.responses.create({
    model: "tiny",
    input: [ask, fcItem, { type: "function_call_output", call_id: fc.call_id, output: '{"sky":"clear"}' }],
    tools: rtools,
    tool_choice: "none",
    temperature: 1,
    seed: 11,
    max_output_tokens: 8,
  });
  out.responses_next = { status: rnext.status, output: rnext.output, output_text: rnext.output_text };

  step = "responses bad tool";
  try {
    await client.responses.create({ model: "tiny", input: "x", tools: [{ type: "web_search" }] });
    out.responses_bad = { status: 200 };
  } catch (e) {
    out.responses_bad = { status: e.status, param: e.param, message: e.message };
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ step, error: String(e), status: e.status, got: out }));
  process.exit(1);
}
