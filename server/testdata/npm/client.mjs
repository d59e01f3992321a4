// Runs the official openai client against a moxie server and prints what it
// saw as one JSON object (read by server/openai_client_test.go).
// Usage: node client.mjs BASE_URL API_KEY MODEL
import OpenAI from 'openai';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const messages = [{ role: 'user', content: 'Hi' }];
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

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
