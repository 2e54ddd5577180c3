// chat.test.mjs - the chat page of `sparq serve` (GET /) in Debian's
// chromium, driven headless by puppeteer-core, against the API it talks to.
// Run by tests/test_webui.c, which starts two servers on loopback:
//   node chat.test.mjs OPEN_URL KEYED_URL KEY PAGE_SOURCE
// OPEN_URL: no API key, stories260K without a chat template (the chatml
// fallback), --parallel 2, -c 256; KEYED_URL: the same with --api-key KEY
// and --chat-template chatml. PAGE_SOURCE: src/server/webui/index.html.
// $CHROMIUM names the browser (default /usr/bin/chromium);
// $SPARQ_WEBUI_SCREENSHOT, a PNG path to save the page to (docs/chat-page.png).
// Prints "ok NAME" or "not ok NAME: why" per check, "webui: N passed, M failed" last.
import puppeteer from 'puppeteer-core';
import { readFileSync } from 'node:fs';

const [openURL, keyedURL, apiKey, pageSource] = process.argv.slice(2);
const MARK = '__SPARQ_NONCE__';
let pass = 0, fail = 0;
function check(cond, name, why = '') {
  if (cond) { pass++; console.log(`ok ${name}`); }
  else { fail++; console.log(`not ok ${name}: ${why}`); }
}
const show = v => JSON.stringify(v);

// ---- the API, straight --------------------------------------------------------

async function api(base, path, body, key) {
  const h = { 'Content-Type': 'application/json' };
  if (key) h.Authorization = `Bearer ${key}`;
  const res = await fetch(base + path, body ? { method: 'POST', headers: h, body: JSON.stringify(body) } : { headers: h });
  return { status: res.status, headers: res.headers, json: res.status === 200 ? await res.json() : await res.text() };
}

// The greedy reply to messages, whole (not streamed: another path than the page's).
async function greedy(base, messages, extra = {}, key) {
  const r = await api(base, '/v1/chat/completions', { messages, temperature: 0, max_tokens: 40, ...extra }, key);
  if (r.status !== 200) throw new Error(`chat completion: ${r.status} ${show(r.json)}`);
  return r.json;
}

// Milliseconds from sending a streamed request to its first text.
async function apiFirstTokenMs(base, messages) {
  const t0 = performance.now();
  const res = await fetch(base + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, temperature: 0, max_tokens: 40, stream: true }) });
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = '', first = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    if (first === null && /"content":"[^"]/.test(buf)) first = performance.now() - t0;
  }
  return first;
}

async function servedPage(base) {
  const res = await fetch(base + '/');
  return { status: res.status, headers: res.headers, body: await res.text() };
}

// ---- GET / and /props without a browser ----------------------------------------------

async function pageAndProps() {
  const src = readFileSync(pageSource, 'utf8');
  const a = await servedPage(openURL), b = await servedPage(openURL);
  const csp = a.headers.get('content-security-policy') || '';
  const nonce = (csp.match(/'nonce-([0-9a-f]{32})'/) || [])[1];
  check(a.status === 200 && /^text\/html; charset=utf-8$/.test(a.headers.get('content-type')), 'GET / is HTML',
        `${a.status} ${a.headers.get('content-type')}`);
  check(nonce && a.body === src.split(MARK).join(nonce), 'GET / is the page source with the nonce filled in',
        `nonce ${nonce}, ${a.body.length} vs ${src.length} bytes`);
  check(src.split(MARK).length === 3 && !a.body.includes(MARK), 'the nonce goes on the one script and the one style');
  const nonceB = ((b.headers.get('content-security-policy') || '').match(/'nonce-([0-9a-f]{32})'/) || [])[1];
  check(nonceB && nonceB !== nonce, 'each copy has its own nonce', `${nonce} ${nonceB}`);
  check(/default-src 'none'/.test(csp) && /connect-src 'self'/.test(csp) && /frame-ancestors 'none'/.test(csp) &&
        !/unsafe-inline/.test(csp), 'Content-Security-Policy', csp);
  check(a.headers.get('cache-control') === 'no-cache' && a.headers.get('x-content-type-options') === 'nosniff' &&
        a.headers.get('x-frame-options') === 'DENY', 'cache and security headers', show([...a.headers]));
  const post = await fetch(openURL + '/', { method: 'POST', body: '{}' });
  check(post.status === 405, 'POST / is 405', String(post.status));

  const p = await api(openURL, '/props');
  const j = p.json, dgs = j.default_generation_settings || {}, sp = j.sparq || {};
  check(p.status === 200 && dgs.n_ctx === 256 && j.total_slots === 2, '/props: n_ctx and total_slots', show(j));
  check(dgs.params && dgs.params.temperature === 1 && dgs.params.top_p === 1 && dgs.params.n_predict === -1 &&
        Array.isArray(dgs.params.samplers) && Array.isArray(dgs.params.stop), '/props: default params', show(dgs.params));
  check(typeof j.model_path === 'string' && j.model_path.endsWith('stories260K.gguf') &&
        j.model_alias === 'stories260K.gguf', '/props: model_path and alias', `${j.model_path} ${j.model_alias}`);
  check(j.chat_template === 'chatml' && j.chat_template_fallback === true, '/props: chatml is the fallback',
        `${j.chat_template} ${j.chat_template_fallback}`);
  check(/^\d+\.\d+\.\d+ \(commit \S+\)$/.test(j.build_info) && j.modalities && j.modalities.vision === false &&
        j.is_sleeping === false, '/props: build_info, modalities', show(j));
  check(sp.attn === 'dense' && Array.isArray(sp.attn_policies) && ['dense', 'sparq', 'oracle', 'topk']
        .every(n => sp.attn_policies.includes(n)) && sp.kv_type === 'f16', '/props: sparq', show(sp));

  const k0 = await api(keyedURL, '/props');
  const k1 = await api(keyedURL, '/props', null, apiKey);
  const kp = await servedPage(keyedURL);
  check(k0.status === 401 && k1.status === 200 && k1.json.chat_template === 'chatml' &&
        k1.json.chat_template_fallback === false, '/props needs the key; --chat-template is no fallback',
        `${k0.status} ${k1.status} ${show(k1.json.chat_template_fallback)}`);
  check(kp.status === 200 && kp.body.includes('<title>sparq</title>'), 'GET / needs no key', String(kp.status));

  // what the page shows under a reply: the API's timings and attention report
  const msgs = [{ role: 'user', content: 'Tell me a story' }];
  const d = await greedy(openURL, msgs);
  const s = await greedy(openURL, msgs, { sparq: { attn: 'sparq', ratio: '1/8' } });
  check(d.timings && d.timings.predicted_n === d.usage.completion_tokens && d.timings.predicted_per_second > 0 &&
        d.sparq && d.sparq.attn === 'dense' && d.sparq.kv_read_fraction === 1, 'a reply reports timings; dense reads all',
        show([d.timings, d.sparq]));
  check(s.sparq && s.sparq.attn === 'sparq' && s.sparq.kv_dense === d.sparq.kv_dense && s.sparq.kv_read > 0 &&
        Math.abs(s.sparq.kv_read_fraction - s.sparq.kv_read / s.sparq.kv_dense) < 1e-6 && s.sparq.kv_read_fraction < 1,
        'SparQ 1/8 reads a fraction of what dense reads', show(s.sparq));
}

// ---- in the browser ---------------------------------------------------------------

// Script errors and console errors (a policy violation is one), but for the
// refusals a test provokes (a 400 or a 401 the page then shows).
function watch(page, problems) {
  page.on('pageerror', e => problems.push(`page error: ${e.message}`));
  page.on('console', m => {
    if (m.type() === 'error' && !/the server responded with a status of 40[01]/.test(m.text()))
      problems.push(`console: ${m.text()}`);
  });
}

async function setSettings(page, values) {
  await page.click('#settings-btn');
  await page.waitForSelector('#settings[open]');
  for (const [id, v] of Object.entries(values)) {
    if (id === 'attn') await page.select('#attn', v);
    else await page.$eval('#' + id, (e, val) => { e.value = val; }, String(v));
  }
  await page.click('#settings-close');
  await page.waitForSelector('#settings:not([open])');
}

// Types text, sends it with Enter, waits for the reply to end; returns its
// text, its stats line and ms from Enter to its first text in the page.
async function say(page, text) {
  const n = await page.$$eval('.msg.assistant .stats[data-done="1"]', e => e.length);
  await page.type('#input', text);
  await page.evaluate(() => {
    window.__first = null;
    const box = document.getElementById('messages');
    const obs = new MutationObserver(() => {
      const last = box.querySelector('.msg.assistant:last-child .content');
      if (last && last.textContent && window.__first === null) { window.__first = performance.now() - window.__t0; obs.disconnect(); }
    });
    obs.observe(box, { childList: true, subtree: true, characterData: true });
    window.__t0 = performance.now();
  });
  await page.keyboard.press('Enter');
  await page.waitForFunction(k => document.querySelectorAll('.msg.assistant .stats[data-done="1"]').length > k,
                             { timeout: 60000 }, n);
  return page.evaluate(() => {
    const m = [...document.querySelectorAll('.msg.assistant')].pop();
    const st = m.querySelector('.stats');
    return { text: m.querySelector('.content').textContent, stats: st.textContent, tps: Number(st.dataset.tps),
             kv: st.dataset.kv === '' ? null : Number(st.dataset.kv), error: st.classList.contains('error'),
             firstMs: window.__first };
  });
}

async function conversation(page) {
  return page.$$eval('.msg', els => els.map(e => ({ role: e.classList.contains('user') ? 'user' : 'assistant',
                                                    content: e.querySelector('.content').textContent })));
}

async function openPage(browser) {
  const problems = [];
  const page = await browser.newPage();
  watch(page, problems);
  await page.setViewport({ width: 900, height: 640 });
  await page.goto(openURL + '/');
  await page.waitForSelector('body[data-ready="1"]', { timeout: 20000 });
  const header = await page.$eval('#model', e => e.textContent);
  check(/stories260K\.gguf/.test(header) && /context 256/.test(header) && /chatml \(fallback\)/.test(header),
        'the page shows the model from /props', header);

  // greedy, two turns: each reply is the API's for the conversation so far
  await setSettings(page, { temperature: 0, max_tokens: 40 });
  const u1 = 'Tell me a story';
  const r1 = await say(page, u1);
  const want1 = await greedy(openURL, [{ role: 'user', content: u1 }]);
  check(r1.text.length > 0 && r1.text === want1.choices[0].message.content, 'streamed reply == API greedy answer',
        `${show(r1.text)} vs ${show(want1.choices[0].message.content)}`);
  check(!r1.error && r1.tps > 0 && r1.kv === 1 && /tok\/s/.test(r1.stats) && /KV read 100\.0%/.test(r1.stats) &&
        r1.stats.startsWith(`${want1.usage.completion_tokens} tokens`), 'tokens/s and KV read under the reply', r1.stats);
  const apiFirst = await apiFirstTokenMs(openURL, [{ role: 'user', content: u1 }]);
  check(r1.firstMs !== null && apiFirst !== null && r1.firstMs - apiFirst < 1000,
        'the first text shows within 1 s of the API\'s first token', `page ${r1.firstMs} ms, API ${apiFirst} ms`);
  const u2 = 'What did the cat do next?';
  const r2 = await say(page, u2);
  const want2 = await greedy(openURL, [{ role: 'user', content: u1 }, { role: 'assistant', content: r1.text },
                                       { role: 'user', content: u2 }]);
  check(r2.text === want2.choices[0].message.content, 'second turn == API greedy answer to the conversation',
        `${show(r2.text)} vs ${show(want2.choices[0].message.content)}`);

  // the conversation and the settings survive a reload (localStorage)
  const before = await conversation(page);
  await page.reload();
  await page.waitForSelector('body[data-ready="1"]');
  const after = await conversation(page);
  check(before.length === 4 && show(after) === show(before), 'the conversation is kept across a reload', show(after));
  const temp = await page.evaluate(() => JSON.parse(localStorage.getItem('sparq.settings')).temperature);
  check(String(temp) === '0', 'settings are kept', String(temp));

  // the attention policy: the request's sparq field; the page shows what the API reports
  await page.click('#new-chat');
  check((await conversation(page)).length === 0, 'new chat empties the conversation');
  await setSettings(page, { attn: 'sparq', ratio: '1/8' });
  const u3 = 'Once upon a time there was a little dog. Tell me what the dog did.';
  const r3 = await say(page, u3);
  const want3 = await greedy(openURL, [{ role: 'user', content: u3 }], { sparq: { attn: 'sparq', ratio: '1/8' } });
  check(r3.text === want3.choices[0].message.content, 'SparQ 1/8 reply == API greedy answer with the same sparq field',
        `${show(r3.text)} vs ${show(want3.choices[0].message.content)}`);
  check(r3.kv !== null && Math.abs(r3.kv - want3.sparq.kv_read_fraction) < 1e-9 && r3.kv < 1 &&
        r3.stats.includes(`KV read ${(want3.sparq.kv_read_fraction * 100).toFixed(1)}%`) && /sparq$/.test(r3.stats),
        'the KV fraction shown is the API\'s', `${r3.stats} vs ${show(want3.sparq)}`);
  const u4 = 'And then?';
  const r4 = await say(page, u4);
  const want4 = await greedy(openURL, [{ role: 'user', content: u3 }, { role: 'assistant', content: r3.text },
                                       { role: 'user', content: u4 }], { sparq: { attn: 'sparq', ratio: '1/8' } });
  check(r4.text === want4.choices[0].message.content, 'SparQ second turn == API', `${show(r4.text)} vs ${show(want4.choices[0].message.content)}`);

  // an error from the server is shown under the reply, not swallowed
  await setSettings(page, { attn: '', sparq_extra: '{"attn": "nonesuch"}' });
  const bad = await say(page, 'Hello');
  check(bad.error && /unknown attention policy/.test(bad.stats), 'a refused request shows its error', bad.stats);
  await page.click('#new-chat');
  await setSettings(page, { attn: 'sparq', ratio: '1/8', sparq_extra: '' });
  await say(page, u3);
  await say(page, u4);

  if (process.env.SPARQ_WEBUI_SCREENSHOT) await page.screenshot({ path: process.env.SPARQ_WEBUI_SCREENSHOT });
  check(problems.length === 0, 'no script error or policy violation in the page', show(problems));
  await page.close();
}

// --api-key: the page asks for the key, refuses a wrong one, then chats with it.
async function keyedPage(browser) {
  const ctx = await browser.createBrowserContext(); // its own localStorage: no key yet
  const page = await ctx.newPage();
  const problems = [];
  watch(page, problems);
  await page.goto(keyedURL + '/');
  await page.waitForSelector('#key-dialog[open]', { timeout: 20000 });
  check(true, 'with --api-key the page asks for the key');
  await page.type('#key-input', 'wrong-key');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => /refused/.test(document.getElementById('key-error').textContent) &&
                             document.getElementById('key-dialog').open, { timeout: 20000 });
  check(true, 'a wrong key is refused and asked again');
  await page.type('#key-input', apiKey);
  await page.click('#key-save');
  await page.waitForSelector('body[data-ready="1"]', { timeout: 20000 });
  check(!(await page.$eval('#key-dialog', d => d.open)), 'the right key is taken');
  await setSettings(page, { temperature: 0, max_tokens: 40 });
  const u = 'Tell me about a dog';
  const r = await say(page, u);
  const want = await greedy(keyedURL, [{ role: 'user', content: u }], {}, apiKey);
  check(r.text === want.choices[0].message.content && !r.error, 'keyed reply == API greedy answer',
        `${show(r.text)} vs ${show(want.choices[0].message.content)}`);
  await page.reload();
  await page.waitForSelector('body[data-ready="1"]', { timeout: 20000 });
  check(!(await page.$eval('#key-dialog', d => d.open)), 'the key is kept across a reload');
  // the server's key changed (here: the stored one spoilt): asked again on the next reply
  await page.evaluate(() => localStorage.setItem('sparq.apiKey', JSON.stringify('stale')));
  await page.reload();
  await page.waitForSelector('#key-dialog[open]', { timeout: 20000 });
  check(true, 'a stale key is asked for again');
  check(problems.length === 0, 'no script error or policy violation in the keyed page', show(problems));
  await ctx.close();
}

async function main() {
  await pageAndProps();
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // root in a container: chromium's sandbox needs user namespaces it may not have
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
  try {
    await openPage(browser);
    await keyedPage(browser);
  } finally {
    await browser.close();
  }
}

try {
  await main();
} catch (e) {
  check(false, 'the test ran to its end', e.stack || String(e));
}
console.log(`webui: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
