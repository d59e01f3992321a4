// Runs the official openai client against a moxie server and prints what it
// saw as one JSON object (read by server/openai_client_test.go).
// Usage: node client.mjs BASE_URL API_KEY MODEL [basic]
// "basic" runs only greedy chat, the same request streamed, a completion and
// an error (for a real model, whose output cannot be scripted).
import OpenAI from 'openai';

const [baseURL, apiKey, model, mode] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const messages = [{ role: 'user', content: 'Hi' }];
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

if (mode === 'basic') {
  const req = { model, messages, temperature: 0, max_tokens: 8 };
  const c = await client.chat.completions.create(req);
  out.chat = { content: c.choices[0].message.content, finish: c.choices[0].finish_reason, usage: c.usage };
  const s = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let usage = null;
  let finish = null;
  for await (const ch of s) {
    if (ch.choices.length > 0) {
      content += ch.choices[0].delta.content ?? '';
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
    if (ch.usage) usage = ch.usage;
  }
  out.stream = { content, finish, usage };
  const comp = await client.completions.create({ model, prompt: 'Once upon', max_tokens: 5, temperature: 0 });
  out.completion = { text: comp.choices[0].text, finish: comp.choices[0].finish_reason, usage: comp.usage };
  try {
    await client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, code: e.code, param: e.param, type: e.type, message: e.message };
  }
  console.log(JSON.stringify(out));
  process.exit(0);
}

const chat = await client.chat.completions.create({ model, messages, temperature: 0, seed: 7 });
out.chat = {
  object: chat.object,
  content: chat.choices[0].message.content,
  role: chat.choices[0].message.role,
  finish: chat.choices[0].finish_reason,
  usage: chat.usage,
};

const think = await client.chat.completions.create({ model, messages, reasoning_effort: 'high' });
out.thinking = {
  content: think.choices[0].message.content,
  reasoning: think.choices[0].message.reasoning_content ?? null,
  reasoningTokens: think.usage?.completion_tokens_details?.reasoning_tokens ?? null,
};

const stream = await client.chat.completions.create({
  model, messages, stream: true, stream_options: { include_usage: true }, stop: ['world'],
});
let content = '';
let chunks = 0;
let finish = null;
let usage = null;
for await (const c of stream) {
  chunks++;
  if (c.choices.length > 0) {
    content += c.choices[0].delta.content ?? '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  if (c.usage) usage = c.usage;
}
out.stream = { content, chunks, finish, usage };

const comp = await client.completions.create({ model, prompt: 'Once upon', max_tokens: 5 });
out.completion = { object: comp.object, text: comp.choices[0].text, finish: comp.choices[0].finish_reason, usage: comp.usage };

const cstream = await client.completions.create({ model, prompt: 'Once', max_tokens: 3, stream: true });
let ctext = '';
for await (const c of cstream) ctext += c.choices[0]?.text ?? '';
out.completionStream = { text: ctext };

const tools = [{
  type: 'function',
  function: {
    name: 'get_weather', description: 'Weather forecast',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
}];
const toolMessages = [{ role: 'user', content: 'Weather in Paris?' }];
const tc = await client.chat.completions.create({ model, messages: toolMessages, tools });
const toolMsg = tc.choices[0].message;
out.tools = {
  finish: tc.choices[0].finish_reason,
  content: toolMsg.content,
  calls: (toolMsg.tool_calls ?? []).map((c) => ({ id: c.id, type: c.type, name: c.function.name, arguments: JSON.parse(c.function.arguments) })),
};
// The client's stream helper accumulates tool-call deltas into a message.
const ts = client.chat.completions.stream({ model, messages: toolMessages, tools });
const final = await ts.finalChatCompletion();
const fm = final.choices[0].message;
out.toolsStream = {
  finish: final.choices[0].finish_reason,
  content: fm.content,
  calls: (fm.tool_calls ?? []).map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) })),
};
// Send the result back: the second turn renders the call and its result.
const second = await client.chat.completions.create({
  model, tools,
  messages: [...toolMessages, toolMsg, { role: 'tool', tool_call_id: toolMsg.tool_calls[0].id, content: 'sunny' }],
});
out.toolsSecondTurn = { finish: second.choices[0].finish_reason };

try {
  await client.chat.completions.create({ model: 'no-such-model', messages });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, code: e.code, param: e.param, type: e.type, message: e.message };
}

try {
  const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await bad.models.list();
  out.authError = null;
} catch (e) {
  out.authError = { status: e.status, code: e.code };
}

console.log(JSON.stringify(out));
