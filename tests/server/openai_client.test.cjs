// deltaq serve against the official openai npm client (a client nobody here wrote).
// Run by run_openai_node.sh (ctest: server_openai_node) with DELTAQ_BIN and DELTAQ_SRC set.
'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const OpenAI = require('openai');

const BIN = process.env.DELTAQ_BIN;
const SRC = process.env.DELTAQ_SRC;
const KEY = 'node-test-key';

// The demo model with the Qwen3 chat template added (it ships none).
function makeModelDir() {
  const from = path.join(SRC, 'models/demo-fortunes/mlx-4bit');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'deltaq-node-'));
  for (const f of fs.readdirSync(from)) {
    if (f !== 'reference.safetensors') fs.copyFileSync(path.join(from, f), path.join(dir, f));
  }
  const tmpl = JSON.parse(fs.readFileSync(path.join(SRC, 'tests/data/chat/tokenizer_config.json'), 'utf8')).chat_template;
  const cfgPath = path.join(dir, 'tokenizer_config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  cfg.chat_template = tmpl;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg, null, 2));
  return dir;
}

let server, port, client, modelDir, modelId;

async function metric(name) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.slice(name.length + 1)) : NaN;
}

test.before(async () => {
  modelDir = makeModelDir();
  server = spawn(BIN, ['serve', '-m', modelDir, '--port', '0', '--api-key', KEY, '--threads', '1', '--ctx', '1024'],
                 { stdio: ['ignore', 'pipe', 'inherit'] });
  port = await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error('deltaq serve did not start: ' + out)), 30000);
    server.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    server.on('exit', (code) => reject(new Error(`deltaq serve exited with ${code}: ${out}`)));
  });
  for (let i = 0; ; ++i) {
    const r = await fetch(`http://127.0.0.1:${port}/health`);
    if (r.status === 200) break;
    assert.equal(r.status, 503);
    if (i > 300) throw new Error('the model did not load');
    await new Promise((r) => setTimeout(r, 100));
  }
  client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60000 });
});

test.after(async () => {
  if (server && server.exitCode === null) {
    const exited = new Promise((r) => server.on('exit', (code, sig) => r({ code, sig })));
    server.kill('SIGTERM');
    const { code } = await exited;
    assert.equal(code, 0, 'deltaq serve exits cleanly on SIGTERM');
  }
  fs.rmSync(modelDir, { recursive: true, force: true });
});

test('models.list', async () => {
  const list = await client.models.list();
  assert.equal(list.data.length, 1);
  modelId = list.data[0].id;
  assert.equal(list.data[0].object, 'model');
  const one = await client.models.retrieve(modelId);
  assert.equal(one.id, modelId);
});

const messages = [
  { role: 'system', content: 'You write fortunes.' },
  { role: 'user', content: 'Tell me my fortune.' },
];

test('chat: streamed text equals non-streamed text for the same seed', async () => {
  const params = { model: 'demo', messages, max_tokens: 40, seed: 42, temperature: 0.9, top_p: 0.95 };
  const plain = await client.chat.completions.create(params);
  assert.equal(plain.object, 'chat.completion');
  const msg = plain.choices[0].message;
  assert.equal(msg.role, 'assistant');
  assert.equal(typeof msg.content, 'string');
  assert.ok(['stop', 'length'].includes(plain.choices[0].finish_reason));
  assert.equal(plain.usage.total_tokens, plain.usage.prompt_tokens + plain.usage.completion_tokens);

  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length) {
      text += chunk.choices[0].delta.content ?? '';
      if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
    }
  }
  assert.ok(chunks > 3);
  assert.equal(text, msg.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  // The same counts; cached_tokens may differ (the second request finds the first's saved state).
  const counts = (u) => ({ prompt: u.prompt_tokens, completion: u.completion_tokens, total: u.total_tokens });
  assert.deepEqual(counts(usage), counts(plain.usage));
});

test('completions: streamed text equals non-streamed text for the same seed', async () => {
  const params = { model: 'demo', prompt: 'A fool and his money', max_tokens: 32, seed: 7, temperature: 1.0 };
  const plain = await client.completions.create(params);
  assert.equal(plain.object, 'text_completion');
  const stream = await client.completions.create({ ...params, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, plain.choices[0].text);
  assert.ok(plain.choices[0].text.length > 0);
});

test('greedy completion and a stop string that is never emitted', async () => {
  const params = { model: 'demo', prompt: 'The best way to predict the future is', max_tokens: 24, temperature: 0 };
  const full = (await client.completions.create(params)).choices[0].text;
  assert.ok(full.startsWith(' to\nsure the way to the same'), JSON.stringify(full));
  const cut = await client.completions.create({ ...params, stop: ['the way', 'never-there'] });
  assert.equal(cut.choices[0].text, full.slice(0, full.indexOf('the way')));
  assert.equal(cut.choices[0].finish_reason, 'stop');
  let streamed = '';
  for await (const c of await client.completions.create({ ...params, stop: 'the way', stream: true }))
    streamed += c.choices[0]?.text ?? '';
  assert.equal(streamed, cut.choices[0].text);
});

test('errors arrive as the client\'s typed errors', async () => {
  const bad = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  await assert.rejects(
    client.chat.completions.create({ model: 'demo', messages, max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'max_tokens');
  await assert.rejects(
    client.chat.completions.create({ model: 'demo', messages, temperature: 'hot' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
  await assert.rejects(client.models.retrieve('gpt-4'), (e) => e instanceof OpenAI.NotFoundError);
});

test('breaking out of a stream cancels the generation on the server', async () => {
  const before = await metric('deltaq_jobs_total{outcome="cancelled"}');
  const stream = await client.completions.create(
    { model: 'demo', prompt: 'Once upon a time', max_tokens: 900, ignore_eos: true, stream: true });
  let n = 0;
  for await (const _ of stream) if (++n === 3) break;  // the client aborts the request
  for (let i = 0; ; ++i) {
    if (await metric('deltaq_jobs_total{outcome="cancelled"}') > before) break;
    if (i > 100) assert.fail('the server did not cancel the abandoned generation');
    await new Promise((r) => setTimeout(r, 50));
  }
  const health = await fetch(`http://127.0.0.1:${port}/health`);
  assert.equal(health.status, 200);
});
