// The engine's /v1/embeddings driven by the official OpenAI Node SDK:
// node embeddings.mjs BASE_URL prints one JSON object of what each call got
// back, for tests/llama_embed_test.go to judge. The SDK asks for base64 by
// default and decodes it; float is asked for too. Any SDK error is printed
// as {"error": …} with the failing call, and exits 1.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "none", maxRetries: 0 });
const inputs = ["The quick brown fox", "jumps over", "the lazy dog"];
const out = {};
let step = "";

try {
  step = "batch (base64, the SDK's default)";
  const batch = await client.embeddings.create({ model: "tiny", input: inputs });
  out.batch = { model: batch.model, usage: batch.usage, data: batch.data.map((d) => ({ index: d.index, embedding: d.embedding })) };
  step = "one (float)";
  const one = await client.embeddings.create({ model: "tiny", input: inputs[1], encoding_format: "float" });
  out.one = { usage: one.usage, embedding: one.data[0].embedding };
  step = "bad encoding_format";
  try {
    await client.embeddings.create({ model: "tiny", input: "x", encoding_format: "int8" });
    out.bad = { status: 0 };
  } catch (e) {
    out.bad = { status: e.status, param: e.param ?? e.error?.param ?? null, message: e.message };
  }
  console.log(JSON.stringify(out));
} catch (e) {
  console.log(JSON.stringify({ error: String(e), step }));
  process.exit(1);
}
