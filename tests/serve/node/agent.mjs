// A tool-calling agent written against the official `openai` npm package, knowing nothing
// of artstore: it is given a base URL and a key, and answers the question in argv.
// Usage: node agent.mjs BASE_URL API_KEY QUESTION stream|whole
import OpenAI from "openai";

const [baseURL, apiKey, question, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: { zone: { type: "string" }, city: { type: "string" } },
        required: ["zone", "city"],
      },
      description: "The weather in a city.",
    },
  },
];
const messages = [
  { role: "system", content: "You are a weather agent." },
  { role: "user", content: question },
];

async function ask() {
  const request = { model: "test-model", messages, tools, logprobs: true };
  if (mode !== "stream") {
    const completion = await client.chat.completions.create(request);
    return completion.choices[0].message;
  }
  const stream = await client.chat.completions.create({ ...request, stream: true });
  const message = { role: "assistant", content: "", tool_calls: [] };
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta ?? {};
    if (delta.content) message.content += delta.content;
    for (const call of delta.tool_calls ?? []) {
      const known = (message.tool_calls[call.index] ??= {
        id: call.id,
        type: "function",
        function: { name: "", arguments: "" },
      });
      if (call.function?.name) known.function.name += call.function.name;
      if (call.function?.arguments) known.function.arguments += call.function.arguments;
    }
  }
  if (message.tool_calls.length === 0) delete message.tool_calls;
  return message;
}

for (let turn = 0; turn < 3; turn++) {
  const message = await ask();
  messages.push(message);
  if (!message.tool_calls?.length) break;
  for (const call of message.tool_calls) {
    const { city } = JSON.parse(call.function.arguments);
    messages.push({ role: "tool", tool_call_id: call.id, content: `sunny in ${city}` });
  }
}
console.log(JSON.stringify({ answer: messages[messages.length - 1].content, turns: messages.length }));
