// The official OpenAI and Anthropic SDKs, unmodified, against napd: run by
// sdk_test.go with NAPD_URL (napd's gateway) and NAPD_KEY (an API key).
// Each check throws on a wrong answer; the last line printed is a JSON
// summary the Go test reads.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import OpenAI, { toFile } from 'openai';
import Anthropic from '@anthropic-ai/sdk';

// Node 18 (Debian 12) has File only in node:buffer; the SDKs' toFile
// needs the global.
if (typeof globalThis.File === 'undefined') {
  globalThis.File = (await import('node:buffer')).File;
}

const base = process.env.NAPD_URL;
const apiKey = process.env.NAPD_KEY;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey, maxRetries: 0 });
const done = [];

// A chat completion. The engine knows the model as "org/chat-model"
// (served_name); the answer names it as the client did.
const chat = await openai.chat.completions.create({
  model: 'chat',
  messages: [{ role: 'user', content: 'hello there' }],
  max_tokens: 3,
});
assert.equal(chat.choices[0].message.content, 'tok2 tok3 tok4');
assert.equal(chat.model, 'chat');
done.push('chat');

// A stream, chunk by chunk.
const stream = await openai.chat.completions.create({
  model: 'chat',
  messages: [{ role: 'user', content: 'one two three' }],
  max_tokens: 4,
  stream: true,
});
let text = '';
const models = new Set();
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? '';
  models.add(chunk.model);
}
assert.equal(text, 'tok3 tok4 tok5 tok6');
assert.deepEqual([...models], ['chat']);
done.push('stream');

// An embedding (the SDK asks for base64 and decodes it).
const emb = await openai.embeddings.create({ model: 'embed', input: ['a b', 'c'] });
assert.equal(emb.data.length, 2);
assert.equal(emb.data[0].embedding.length, 8);
const norm = Math.hypot(...emb.data[0].embedding);
assert.ok(Math.abs(norm - 1) < 1e-5, `embedding norm ${norm}`);
done.push('embedding');

// A transcription upload: multipart, the file (3 MiB) before the model
// field, as this SDK writes it.
const audio = Buffer.alloc(3 << 20, 7);
const sha = createHash('sha256').update(audio).digest('hex').slice(0, 16);
const tr = await openai.audio.transcriptions.create({
  file: await toFile(audio, 'speech.wav'),
  model: 'whisper',
});
assert.equal(tr.text, `speech.wav: ${audio.length} bytes, sha256 ${sha}`);
done.push('transcription');

// A message, by an alias, with the key in x-api-key.
const msg = await anthropic.messages.create({
  model: 'claude-demo',
  max_tokens: 3,
  messages: [{ role: 'user', content: 'hi there' }],
});
assert.equal(msg.content[0].text, 'tok2 tok3 tok4');
assert.equal(msg.model, 'claude-demo');
done.push('message');

// A message stream through the SDK's event parser.
const ms = anthropic.messages.stream({
  model: 'claude-demo',
  max_tokens: 2,
  messages: [{ role: 'user', content: 'hi' }],
});
const final = await ms.finalMessage();
assert.equal(final.content[0].text, 'tok1 tok2');
assert.equal(final.model, 'claude-demo');
done.push('message-stream');

const count = await anthropic.messages.countTokens({
  model: 'claude-demo',
  messages: [{ role: 'user', content: 'one two three' }],
});
assert.equal(count.input_tokens, 3);
done.push('count-tokens');

// napd's own errors on the Anthropic routes come in Anthropic's shape.
await assert.rejects(
  anthropic.messages.create({ model: 'nope', max_tokens: 1, messages: [{ role: 'user', content: 'x' }] }),
  (err) => err instanceof Anthropic.NotFoundError && err.error?.error?.type === 'not_found_error',
);
done.push('anthropic-error');

console.log(JSON.stringify({ ok: true, done }));
