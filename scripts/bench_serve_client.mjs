#!/usr/bin/env node
// bench_serve_client.mjs - the load generator behind scripts/bench_serve.sh.
// Node 20, built-in modules only (node:http rather than fetch: fetch's
// built-in client gives up after 300 s without response headers, and a
// 16 x 4k-token prefill on 2 cores can take longer than that).
//
//   prepare --url U --out FILE --n N --tokens D [--shared] --text-dir DIR
//       builds N prompts as token ids (tokenized once by the server at U with
//       POST /tokenize, so every server under test gets the same ids): each
//       client its own excerpt of the text files plus a question, D tokens in
//       all; with --shared one document and N different questions.
//   run --url U --prompts FILE --max-tokens G --label L --out FILE
//       [--sparq-attn POLICY --sparq-ratio R] [--meta JSON] [--prime]
//       [--ban-tokens IDS]
//       sends the N prompts at once as streaming /v1/completions (temperature
//       0, ignore_eos) and writes per-request timings and the aggregates;
//       --prime first sends the first document alone (not counted).
//       --ban-tokens 3-258 (ids and ranges, comma-separated) adds OpenAI's
//       "logit_bias": {"3": -100, ..., "258": -100} to every request (the
//       warm-up and priming ones too). Why: on a random-weight model the
//       greedy token is arbitrary, and a byte token (<0xNN>) that makes
//       invalid UTF-8 fails llama-server's request with HTTP 500 ("does not
//       match the expected Content-only format"); bench_serve.sh bans the
//       byte tokens of gen-model's SentencePiece vocabulary.
//   report --dir DIR
//       prints a markdown table of every run's JSON in DIR, with ratios to
//       llama-server's best -fa setting on the same model and scenario.
//
// Timing: a token's time is when its SSE event arrives. A server may pack
// several tokens into one event when the client reads late; the token count
// comes from the final event's usage.completion_tokens, the inter-token
// latencies from the gaps between events (so a packed event counts as one
// gap, and "events" is recorded next to "tokens" to show when it happened).
import fs from 'node:fs';
import path from 'node:path';
import { completionStream, die, parseArgs, parseIds, request, setProgName, tokenize } from './bench_http.mjs';

setProgName('bench_serve_client');





const QUESTIONS = [
  'What is the main argument of the text above?',
  'Summarize the text above in one sentence.',
  'Which people or places are mentioned above?',
  'What is the tone of the passage?',
  'List three facts stated in the text.',
  'What would be a good title for this text?',
  'What does the author recommend?',
  'Which sentence above is the most surprising, and why?',
  'What question does the text leave open?',
  'Explain the first paragraph to a child.',
  'What is the text\'s strongest claim?',
  'Who is the intended audience of the text?',
  'What happens at the end of the passage?',
  'Name one word from the text and define it.',
  'What evidence does the text give for its claims?',
  'How could the text be shortened?',
];

function question(i) {
  const q = QUESTIONS[i % QUESTIONS.length];
  return `\n\nQuestion ${i + 1}: ${q}\nAnswer:`;
}

function loadCorpus(dir) {
  // the larger plain-text files, in a fixed order, so excerpts are reproducible
  const names = ['PaulGrahamEssays_all_sorted.txt', 'wikitext-2-raw_wiki.test.raw', 'tinyshakespeare_input.txt'];
  const texts = names.map((n) => path.join(dir, n)).filter((p) => fs.existsSync(p)).map((p) => fs.readFileSync(p, 'utf8'));
  if (!texts.length) die(`none of ${names.join(', ')} in ${dir}`);
  return texts.join('\n\n');
}

async function prepare(a) {
  const url = a.url, n = +a.n, d = +a.tokens;
  if (!url || !a.out || !(n >= 1) || !(d >= 16)) die('prepare needs --url, --out, --n >= 1, --tokens >= 16');
  const corpus = loadCorpus(a['text-dir'] || '../shared/data/text');
  const nDocs = a.shared ? 1 : n;
  // each client starts at its own offset, far enough apart that excerpts do not overlap
  // when the corpus allows it (it wraps around otherwise, still at different offsets)
  const chars = Math.ceil(d * 6);
  const stride = Math.max(1, Math.floor((corpus.length - chars) / nDocs));
  const docs = [];
  for (let i = 0; i < nDocs; i++) {
    let take = chars, ids;
    for (;;) {
      const off = (i * stride) % Math.max(1, corpus.length - take);
      ids = await tokenize(url, corpus.slice(off, off + take), true);
      if (ids.length >= d || take >= corpus.length) break;
      take *= 2;
    }
    docs.push(ids);
  }
  const prompts = [], docTokens = [];
  for (let i = 0; i < n; i++) {
    const q = await tokenize(url, question(i), false);
    const doc = docs[a.shared ? 0 : i];
    const keep = d - q.length;
    if (keep < 1 || doc.length < keep) die(`cannot make a ${d}-token prompt (document has ${doc.length} tokens, question ${q.length})`);
    prompts.push(doc.slice(0, keep).concat(q));
    docTokens.push(keep);
  }
  fs.writeFileSync(a.out, JSON.stringify({ n, tokens: d, shared: !!a.shared, doc_tokens: docTokens, prompts }));
}

function pct(sorted, p) {
  if (!sorted.length) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}


async function one(url, prompt, maxTokens, sparq, t0, logitBias) {
  const body = { prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true };
  if (sparq) body.sparq = sparq;
  if (logitBias) body.logit_bias = logitBias;
  const rec = { t_send: performance.now() - t0, events: [], tokens: null, prompt_tokens: prompt.length, finish: null };
  const st = completionStream(t0, (now) => rec.events.push(now));
  const r = await request(`${url}/v1/completions`, 'POST', body, st.onData);
  rec.t_end = performance.now() - t0;
  rec.finish = st.finish;
  rec.tokens = st.tokens;
  let error = st.error;
  if (r.status !== 200) error = `HTTP ${r.status}: ${r.body.slice(0, 200)}`;
  if (error) throw new Error(error);
  if (rec.tokens === null) rec.tokens = rec.events.length; // no usage in the stream: one token per event
  if (!rec.events.length) throw new Error('no token arrived');
  return rec;
}

async function run(a) {
  const url = a.url, maxTokens = +a['max-tokens'];
  if (!url || !a.prompts || !a.out || !(maxTokens >= 1)) die('run needs --url, --prompts, --max-tokens >= 1, --out');
  const P = JSON.parse(fs.readFileSync(a.prompts, 'utf8'));
  const sparq = a['sparq-attn'] ? { attn: a['sparq-attn'] } : null;
  if (sparq && a['sparq-ratio']) sparq.ratio = a['sparq-ratio'];
  let bias = null;
  if (a['ban-tokens']) {
    bias = {};
    for (const id of parseIds(a['ban-tokens'])) bias[String(id)] = -100;
  }
  // warm-up: one short request (page faults, thread start-up) not counted;
  // the question's last tokens, a prefix of no prompt, so no cache gets a head start
  await one(url, P.prompts[0].slice(-8), 2, sparq, performance.now(), bias).catch((e) => die(`warm-up request to ${url}: ${e.message}`));
  // --prime: the first document alone first (1 token generated), not counted:
  // the shared document is then already in the server's prompt cache, as
  // when earlier clients asked about it
  let primeMs = null;
  if (a.prime) {
    const tp = performance.now();
    await one(url, P.prompts[0].slice(0, P.doc_tokens[0]), 1, sparq, tp, bias).catch((e) => die(`priming request to ${url}: ${e.message}`));
    primeMs = performance.now() - tp;
  }
  const t0 = performance.now();
  let reqs;
  try {
    reqs = await Promise.all(P.prompts.map((p) => one(url, p, maxTokens, sparq, t0, bias)));
  } catch (e) {
    die(`request to ${url} failed: ${e.message}`);
  }
  const wall = Math.max(...reqs.map((r) => r.t_end));
  const itl = [], ttft = [];
  let gen = 0, prompt = 0, events = 0;
  for (const r of reqs) {
    r.ttft_ms = r.events[0] - r.t_send;
    ttft.push(r.ttft_ms);
    r.itl_ms = r.events.slice(1).map((t, i) => t - r.events[i]);
    itl.push(...r.itl_ms);
    gen += r.tokens;
    prompt += r.prompt_tokens;
    events += r.events.length;
  }
  itl.sort((x, y) => x - y);
  ttft.sort((x, y) => x - y);
  const firstFirst = Math.min(...reqs.map((r) => r.events[0]));
  const lastLast = Math.max(...reqs.map((r) => r.events[r.events.length - 1]));
  const short = reqs.filter((r) => r.tokens < maxTokens).length;
  const out = {
    label: a.label || '', url, meta: a.meta ? JSON.parse(a.meta) : {},
    sparq, n: reqs.length, prompt_tokens_each: P.tokens, shared: P.shared, max_tokens: maxTokens,
    primed: !!a.prime, prime_ms: primeMs,
    banned_tokens: a['ban-tokens'] ? String(a['ban-tokens']) : null,
    date: new Date().toISOString(),
    summary: {
      wall_s: wall / 1000,
      generated_tokens: gen, prompt_tokens: prompt, events,
      requests_short_of_max_tokens: short,
      // the decode window: from the first request's first token to the last token of all
      decode_tok_s: lastLast > firstFirst ? gen / ((lastLast - firstFirst) / 1000) : null,
      generated_tok_s_wall: gen / (wall / 1000),
      total_tok_s_wall: (gen + prompt) / (wall / 1000),
      ttft_ms_p50: pct(ttft, 50), ttft_ms_max: ttft[ttft.length - 1],
      itl_ms_p50: pct(itl, 50), itl_ms_p99: pct(itl, 99),
    },
    requests: reqs,
  };
  if (short) process.stderr.write(`bench_serve_client: warning: ${short} request(s) stopped before ${maxTokens} tokens\n`);
  fs.writeFileSync(a.out, JSON.stringify(out, null, 1));
  const s = out.summary;
  process.stderr.write(`bench_serve_client: ${out.label}: decode ${s.decode_tok_s?.toFixed(1)} tok/s, ` +
    `TTFT p50 ${s.ttft_ms_p50.toFixed(0)} ms, ITL p50/p99 ${s.itl_ms_p50?.toFixed(1)}/${s.itl_ms_p99?.toFixed(1)} ms\n`);
}

function report(a) {
  const dir = a.dir;
  if (!dir) die('report needs --dir');
  const runs = fs.readdirSync(dir).filter((f) => f.endsWith('.json') && f.startsWith('run-'))
    .map((f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')));
  if (!runs.length) die(`no run-*.json in ${dir}`);
  const f = (x, d = 1) => (x === null || x === undefined ? '-' : x.toFixed(d));
  const key = (r) => `${r.meta.model}|${r.meta.scenario}`;
  // llama-server's best -fa setting per (model, scenario), by decode
  // throughput for the decode ratio and by total throughput for the total one
  const best = {}, bestTotal = {};
  for (const r of runs) {
    if (r.meta.server !== 'llama-server') continue;
    const k = key(r);
    if (!best[k] || r.summary.decode_tok_s > best[k].summary.decode_tok_s) best[k] = r;
    if (!bestTotal[k] || r.summary.total_tok_s_wall > bestTotal[k].summary.total_tok_s_wall) bestTotal[k] = r;
  }
  const lines = [];
  lines.push('| model | scenario | server | attention | clients x prompt | decode tok/s | gen tok/s (wall) | total tok/s (wall) | TTFT p50 ms | TTFT max ms | ITL p50 ms | ITL p99 ms | decode vs llama-server | total vs llama-server |');
  lines.push('|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  runs.sort((x, y) => key(x).localeCompare(key(y)) || (x.meta.order ?? 0) - (y.meta.order ?? 0));
  for (const r of runs) {
    const s = r.summary, b = best[key(r)], bt = bestTotal[key(r)];
    let ratio = '-', tratio = '-';
    if (r.meta.server === 'llama-server') {
      ratio = b === r ? 'best' : '';
      tratio = bt === r ? 'best' : '';
    } else {
      if (b && b.summary.decode_tok_s) ratio = `${(s.decode_tok_s / b.summary.decode_tok_s).toFixed(2)}x`;
      if (bt && bt.summary.total_tok_s_wall) tratio = `${(s.total_tok_s_wall / bt.summary.total_tok_s_wall).toFixed(2)}x`;
    }
    lines.push(`| ${r.meta.model} | ${r.meta.scenario} | ${r.meta.server} | ${r.meta.attn} | ${r.n} x ${r.prompt_tokens_each} | ` +
      `${f(s.decode_tok_s)} | ${f(s.generated_tok_s_wall)} | ${f(s.total_tok_s_wall)} | ${f(s.ttft_ms_p50, 0)} | ${f(s.ttft_ms_max, 0)} | ` +
      `${f(s.itl_ms_p50)} | ${f(s.itl_ms_p99)} | ${ratio} | ${tratio} |`);
  }
  // the logit_bias ban each run sent: the same for all, or run by run
  // (when only llama-server got it, the servers generated different ids)
  const ban = (r) => (r.banned_tokens ? `logit_bias -100 on token ids ${r.banned_tokens}` : 'no logit_bias');
  const bans = new Set(runs.map(ban));
  lines.push('');
  if (bans.size === 1) lines.push(`Every run: ${ban(runs[0])}.`);
  else for (const r of runs) lines.push(`- ${r.label}: ${ban(r)}`);
  process.stdout.write(lines.join('\n') + '\n');
}

const a = parseArgs(process.argv.slice(2));
const cmd = a._[0];
if (cmd === 'prepare') await prepare(a);
else if (cmd === 'run') await run(a);
else if (cmd === 'report') report(a);
else die('usage: bench_serve_client.mjs prepare|run|report ... (see the comment at the top)');
