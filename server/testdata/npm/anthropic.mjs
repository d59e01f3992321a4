// Runs the official Anthropic client against a moxie server's Messages API
// and prints what it saw as one JSON object (read by
// server/anthropic_client_test.go).
// Usage: node anthropic.mjs BASE_URL API_KEY MODEL
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, apiKey, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0, timeout: 30000 });
const messages = [{ role: 'user', content: 'Hi' }];
const out = {};

const msg = await client.messages.create({ model, max_tokens: 64, messages });
out.message = {
  type: msg.type,
  role: msg.role,
  content: msg.content,
  stopReason: msg.stop_reason,
  usage: msg.usage,
};

const think = await client.messages.create({ model, max_tokens: 64, messages, thinking: { type: 'enabled', budget_tokens: 1024 } });
out.thinking = think.content.map((b) => ({ type: b.type, text: b.text ?? b.thinking }));

// The SDK's stream helper assembles the events into a final message.
const stream = client.messages.stream({ model, max_tokens: 64, messages });
let text = '';
stream.on('text', (t) => { text += t; });
const final = await stream.finalMessage();
out.stream = { text, content: final.content, stopReason: final.stop_reason, usage: final.usage };

const tools = [{ name: 'get_weather', description: 'Weather forecast', input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } }];
const tq = [{ role: 'user', content: 'Weather in Paris?' }];
const tm = await client.messages.create({ model, max_tokens: 512, messages: tq, tools });
out.tools = { stopReason: tm.stop_reason, content: tm.content };
const ts = client.messages.stream({ model, max_tokens: 512, messages: tq, tools });
const tf = await ts.finalMessage();
out.toolsStream = { stopReason: tf.stop_reason, content: tf.content };

const count = await client.messages.countTokens({ model, messages });
out.count = count.input_tokens;

try {
  await client.messages.create({ model: 'claude-nope', max_tokens: 8, messages });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, type: e.error?.error?.type ?? null, message: e.error?.error?.message ?? e.message };
}
console.log(JSON.stringify(out));
