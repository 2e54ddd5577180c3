// openai.test.mjs - the official openai npm client against `sparq serve`.
// Run by tests/test_server.c: node openai.test.mjs BASE_URL API_KEY EXPECT.json
// EXPECT.json: {"cases": [{"prompt", "max_tokens", "sparq": {...}|null, "text"}]}
// where text is what `sparq run` printed for the same prompt, policy and
// greedy sampling. Prints "ok NAME" or "not ok NAME: why" per check and
// "openai: N passed, M failed" last.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [baseURL, apiKey, expectPath] = process.argv.slice(2);
const expect = JSON.parse(readFileSync(expectPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
function check(cond, name, why = '') {
  if (cond) { pass++; console.log(`ok ${name}`); }
  else { fail++; console.log(`not ok ${name}: ${why}`); }
}
const model = 'stories260K';

async function completion(c, extra = {}) {
  const body = { model, prompt: c.prompt, max_tokens: c.max_tokens, temperature: 0, ...extra };
  if (c.sparq) body.sparq = c.sparq;
  return client.completions.create(body);
}

async function streamText(c) {
  const body = { model, prompt: c.prompt, max_tokens: c.max_tokens, temperature: 0, stream: true };
  if (c.sparq) body.sparq = c.sparq;
  const stream = await client.completions.create(body);
  let text = '', finish = null, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    text += ch.choices[0].text;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  return { text, finish, chunks };
}

async function main() {
  const models = await client.models.list();
  check(models.data.length === 1 && typeof models.data[0].id === 'string', 'models.list', JSON.stringify(models.data));

  // greedy through the server == sparq run, one request at a time
  const alone = [];
  for (const [i, c] of expect.cases.entries()) {
    const r = await completion(c);
    alone.push(r.choices[0].text);
    const pol = c.sparq ? JSON.stringify(c.sparq) : 'default';
    check(r.choices[0].text === c.text, `completion ${i} (${pol}) == sparq run`,
          `${JSON.stringify(r.choices[0].text)} vs ${JSON.stringify(c.text)}`);
    check(r.object === 'text_completion' && /^cmpl-/.test(r.id) && r.usage.completion_tokens > 0 &&
          r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens &&
          ['stop', 'length'].includes(r.choices[0].finish_reason), `completion ${i} shape`, JSON.stringify(r));
  }

  // sixteen concurrent streams, different policies, each exactly as alone
  const concurrent = await Promise.all(expect.cases.map(c => streamText(c)));
  concurrent.forEach((s, i) => {
    check(s.text === alone[i], `concurrent stream ${i} == alone`, `${JSON.stringify(s.text)} vs ${JSON.stringify(alone[i])}`);
    check(s.finish === 'length' || s.finish === 'stop', `concurrent stream ${i} finish_reason`, String(s.finish));
  });

  // logprobs: the greedy token is the most likely one; shapes
  const c0 = expect.cases[0];
  const lp = await completion(c0, { logprobs: 3 });
  const L = lp.choices[0].logprobs;
  check(L && L.tokens.length === lp.usage.completion_tokens && L.token_logprobs.length === L.tokens.length &&
        L.top_logprobs.length === L.tokens.length && L.text_offset.length === L.tokens.length, 'completion logprobs shape',
        JSON.stringify(L));
  check(L && L.token_logprobs.every((v, i) => v <= 0 && Object.keys(L.top_logprobs[i]).length <= 3 &&
        Math.max(...Object.values(L.top_logprobs[i])) === v), 'greedy token is the top logprob', JSON.stringify(L));
  check(L && L.tokens.join('') === lp.choices[0].text, 'logprob tokens spell the text', JSON.stringify(L && L.tokens));

  // echo with logprobs (lm-evaluation-harness loglikelihood): max_tokens 0
  const ec = await client.completions.create({ model, prompt: c0.prompt, max_tokens: 0, echo: true, logprobs: 1 });
  const E = ec.choices[0].logprobs;
  check(E && E.tokens.length === ec.usage.prompt_tokens - 1 && E.token_logprobs.slice(1).every(v => v <= 0) &&
        ec.usage.completion_tokens === 0, 'echo + logprobs, max_tokens 0', JSON.stringify(ec));

  // stop strings: the text ends where the stop string would begin
  const full = alone[0];
  const cut = full.indexOf(' ', 8);
  if (cut > 0) {
    const stopWord = full.slice(cut, cut + 4);
    const st = await completion(c0, { stop: [stopWord, 'never-there'] });
    check(st.choices[0].text === full.slice(0, full.indexOf(stopWord)) && st.choices[0].finish_reason === 'stop',
          'stop string', `${JSON.stringify(st.choices[0].text)} stop ${JSON.stringify(stopWord)}`);
    const ss = await client.completions.create({ model, prompt: c0.prompt, max_tokens: c0.max_tokens, temperature: 0,
                                                 stop: stopWord, stream: true });
    let t = '';
    for await (const ch of ss) t += ch.choices[0].text;
    check(t === st.choices[0].text, 'stop string, streamed', JSON.stringify(t));
    // several stop strings: the earliest in the text cuts, whatever the list's order
    const later = full.slice(cut + 1, cut + 5);
    const sm = await completion(c0, { stop: [later, stopWord] });
    const first = full.slice(0, Math.min(full.indexOf(later), full.indexOf(stopWord)));
    check(sm.choices[0].text === first, 'earliest of several stop strings',
          `${JSON.stringify(sm.choices[0].text)} stops ${JSON.stringify([later, stopWord])}`);
  } else check(false, 'stop string', 'reference text too short');
  // echo: the prompt is no reply, so a stop string in it cuts nothing
  const inPrompt = c0.prompt.slice(0, 4);
  const es = await completion(c0, { echo: true, stop: [inPrompt] });
  check(es.choices[0].text.includes(c0.prompt), 'echo keeps a prompt holding a stop string',
        `${JSON.stringify(es.choices[0].text)} stop ${JSON.stringify(inPrompt)}`);

  // seeded sampling is reproducible
  const a = await completion(c0, { temperature: 1, seed: 1234 });
  const b = await completion(c0, { temperature: 1, seed: 1234 });
  check(a.choices[0].text === b.choices[0].text, 'same seed, same text', `${a.choices[0].text} | ${b.choices[0].text}`);

  // min_p = 1 keeps only the most likely token: any seed gives the greedy text
  const mp = await completion(c0, { temperature: 1, min_p: 1, seed: 99 });
  check(mp.choices[0].text === alone[0], 'min_p 1 == greedy', JSON.stringify(mp.choices[0].text));

  // chat, whole and streamed
  const msgs = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'Tell me about a cat.' }];
  const ch = await client.chat.completions.create({ model, messages: msgs, max_tokens: 20, temperature: 0,
                                                    logprobs: true, top_logprobs: 2 });
  const m = ch.choices[0];
  check(ch.object === 'chat.completion' && /^chatcmpl-/.test(ch.id) && m.message.role === 'assistant' &&
        typeof m.message.content === 'string' && ch.usage.completion_tokens > 0, 'chat shape', JSON.stringify(ch));
  check(m.logprobs && m.logprobs.content.length === ch.usage.completion_tokens &&
        m.logprobs.content.every(t => t.top_logprobs.length === 2 && t.top_logprobs[0].logprob === t.logprob),
        'chat logprobs', JSON.stringify(m.logprobs));
  const cs = await client.chat.completions.create({ model, messages: msgs, max_tokens: 20, temperature: 0, stream: true });
  let ct = '', role = null, cfin = null;
  for await (const c of cs) {
    if (c.choices[0].delta.role) role = c.choices[0].delta.role;
    ct += c.choices[0].delta.content || '';
    if (c.choices[0].finish_reason) cfin = c.choices[0].finish_reason;
  }
  check(role === 'assistant' && ct === m.message.content && cfin === m.finish_reason, 'chat stream == chat',
        `${JSON.stringify(ct)} vs ${JSON.stringify(m.message.content)}`);

  // errors arrive as the client's typed exceptions with OpenAI error objects
  async function expectError(name, fn, status, re) {
    try {
      await fn();
      check(false, name, 'no error');
    } catch (e) {
      check(e instanceof OpenAI.APIError && e.status === status && re.test(e.message), name, `${e.status} ${e.message}`);
    }
  }
  await expectError('n > 16 rejected', () => completion(c0, { n: 17 }), 400, /'n'/);
  await expectError('unsupported schema keyword named', () => client.chat.completions.create({ model, messages: msgs,
    max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string',
      pattern: '^a' } } } }), 400, /unsupported keyword 'pattern'/);
  await expectError('tools refused', () => client.chat.completions.create({ model, messages: msgs, max_tokens: 4,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }] }),
    400, /tools is not supported/);

  // n choices: greedy, each is the text alone; sampled, each as its own seed
  const r0 = await completion(c0);
  const n3 = await completion(c0, { n: 3 });
  check(n3.choices.length === 3 && n3.choices.every((c, i) => c.index === i && c.text === alone[0]) &&
        n3.usage.completion_tokens === 3 * r0.usage.completion_tokens, 'n 3 greedy', JSON.stringify(n3));
  const ns = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, temperature: 1, seed: 7, n: 2,
                                                    stream: true });
  const parts = ['', ''];
  let fins = 0;
  for await (const c of ns) for (const ch of c.choices) { parts[ch.index] += ch.delta.content || ''; fins += !!ch.finish_reason; }
  const one = await client.chat.completions.create({ model, messages: msgs, max_tokens: 8, temperature: 1, seed: 8 });
  check(fins === 2 && parts[1] === one.choices[0].message.content, 'n 2 streamed: choice 1 is seed + 1',
        `${JSON.stringify(parts)} vs ${JSON.stringify(one.choices[0].message.content)}`);
  await expectError('bad policy rejected', () => completion(c0, { sparq: { attn: 'nope' } }), 400, /unknown attention policy/);
  await expectError('bad ratio rejected', () => completion(c0, { sparq: { attn: 'sparq', ratio: '3/2' } }), 400, /ratio/);
  await expectError('wrong type rejected', () => completion(c0, { temperature: 'hot' }), 400, /temperature/);
  await expectError('prompt too long', () => client.completions.create({ model, prompt: 'la '.repeat(5000) }), 400, /limit/);
  const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 });
  await expectError('wrong API key', () => bad.models.list(), 401, /API key/);
}

main().catch(e => { fail++; console.log(`not ok uncaught: ${e && e.stack}`); })
  .finally(() => console.log(`openai: ${pass} passed, ${fail} failed`));
