#!/usr/bin/env node
// bench_kvdir_client.mjs - the client behind scripts/bench_kvdir.sh (time to
// first token with a shared --kv-dir). Node 20, built-in modules only
// (node:http, not fetch: fetch gives up after 300 s without response headers,
// and a cold 16k-token prefill of llama-3.2-1b on 2 cores takes longer).
//
//   prepare --url U --out FILE --tokens D --text-dir DIR
//       one document of exactly D token ids (an excerpt of the text files,
//       tokenized by the server at U with POST /tokenize, BOS included) and
//       three questions (ids, no BOS) to append to it. The server caches a
//       prompt's prefix cut at floor((n_prompt - 1) / n_batch) * n_batch, so
//       with D a multiple of n_batch and a question shorter than n_batch the
//       cached prefix is exactly the document: the file replica A writes is
//       the one B looks for.
//   ask --url U --prompts FILE --question I --out FILE [--max-tokens G]
//       [--ban-tokens IDS] [--warmup]
//       one streaming /v1/completions request (document + question I,
//       temperature 0, ignore_eos) and its timings: ttft_ms = from just before
//       the request is written to the arrival of the first SSE event whose
//       text is not empty (curl's time_starttransfer is the arrival of the
//       response's first byte, which may be the headers, not a token);
//       first_event_ms = the
//       first `data:` event of any kind. --warmup sends only the question's
//       last 8 tokens (shorter than n_batch: nothing is cached, no file
//       written), to fault in the weights before anything is timed.
//   report --dir DIR
//       the markdown table over DIR/<model>-<D>-r<rep>/ (see bench_kvdir.sh).
import fs from 'node:fs';
import path from 'node:path';
import { completionStream, die, parseArgs, parseIds, request, setProgName, tokenize } from './bench_http.mjs';

setProgName('bench_kvdir_client');





const QUESTIONS = [
  '\n\nQuestion: What is the main argument of the text above?\nAnswer:',
  '\n\nQuestion: Which people or places are mentioned above?\nAnswer:',
  '\n\nQuestion: What would be a good title for this text?\nAnswer:',
];

async function prepare(a) {
  const url = a.url, d = +a.tokens;
  if (!url || !a.out || !(d >= 16)) die('prepare needs --url, --out, --tokens >= 16');
  const dir = a['text-dir'] || '../shared/data/text';
  // the same files and order as bench_serve_client.mjs: reproducible excerpts
  const names = ['PaulGrahamEssays_all_sorted.txt', 'wikitext-2-raw_wiki.test.raw', 'tinyshakespeare_input.txt'];
  const texts = names.map((n) => path.join(dir, n)).filter((p) => fs.existsSync(p)).map((p) => fs.readFileSync(p, 'utf8'));
  if (!texts.length) die(`none of ${names.join(', ')} in ${dir}`);
  const corpus = texts.join('\n\n');
  let take = Math.ceil(d * 6), ids;
  for (;;) {
    ids = await tokenize(url, corpus.slice(0, take), true);
    if (ids.length >= d || take >= corpus.length) break;
    take *= 2;
  }
  if (ids.length < d) die(`the text in ${dir} gives only ${ids.length} tokens, ${d} wanted`);
  const questions = [];
  for (const q of QUESTIONS) questions.push(await tokenize(url, q, false));
  fs.writeFileSync(a.out, JSON.stringify({ doc_tokens: d, doc: ids.slice(0, d), questions }));
  process.stdout.write(`${Math.max(...questions.map((q) => q.length))}\n`); // longest question, for the caller's check
}


async function ask(a) {
  const url = a.url, maxTokens = a['max-tokens'] === undefined ? 4 : +a['max-tokens'], qi = +a.question;
  if (!url || !a.prompts || !a.out || !(maxTokens >= 1) || !(qi >= 0 && qi < QUESTIONS.length))
    die(`ask needs --url, --prompts, --out, --question 0..${QUESTIONS.length - 1}, --max-tokens >= 1`);
  const P = JSON.parse(fs.readFileSync(a.prompts, 'utf8'));
  const q = P.questions[qi];
  const prompt = a.warmup ? q.slice(-8) : P.doc.concat(q);
  const body = { prompt, max_tokens: maxTokens, temperature: 0, stream: true, ignore_eos: true };
  if (a['ban-tokens']) {
    body.logit_bias = {};
    for (const id of parseIds(a['ban-tokens'])) body.logit_bias[String(id)] = -100;
  }
  const rec = { url, question: qi, warmup: !!a.warmup, prompt_tokens: prompt.length, max_tokens: maxTokens,
    first_event_ms: null, ttft_ms: null, total_ms: null, events: 0, tokens: null, text: '', finish: null };
  const t0 = performance.now();
  const st = completionStream(t0, (now, text) => {
    if (rec.ttft_ms === null) rec.ttft_ms = now;
    rec.events++;
    rec.text += text;
  }, (now) => { if (rec.first_event_ms === null) rec.first_event_ms = now; });
  const r = await request(`${url}/v1/completions`, 'POST', body, st.onData).catch((e) => die(`POST ${url}/v1/completions: ${e.message}`));
  rec.total_ms = performance.now() - t0;
  rec.finish = st.finish;
  rec.tokens = st.tokens;
  let error = st.error;
  if (r.status !== 200) error = `HTTP ${r.status}: ${r.body.slice(0, 200)}`;
  if (!error && rec.ttft_ms === null) error = 'no token with text arrived';
  if (error) die(`question ${qi} to ${url}: ${error}`);
  fs.writeFileSync(a.out, JSON.stringify(rec, null, 1) + '\n');
  process.stderr.write(`bench_kvdir_client: ${a.warmup ? 'warm-up' : `question ${qi}`} (${prompt.length} tokens): ` +
    `TTFT ${rec.ttft_ms.toFixed(1)} ms, total ${rec.total_ms.toFixed(1)} ms\n`);
}

// one metric's value from a /metrics dump (null when absent)
function metric(file, name) {
  if (!fs.existsSync(file)) return null;
  const m = new RegExp(`^${name} ([0-9.eE+-]+)$`, 'm').exec(fs.readFileSync(file, 'utf8'));
  return m ? +m[1] : null;
}

function report(a) {
  const dir = a.dir;
  if (!dir) die('report needs --dir');
  const reps = fs.readdirSync(dir).filter((f) => /-r\d+$/.test(f) && fs.statSync(path.join(dir, f)).isDirectory());
  if (!reps.length) die(`no <model>-<tokens>-r<rep> directories in ${dir}`);
  const groups = new Map();
  const problems = [];
  for (const name of reps.sort()) {
    const d = path.join(dir, name);
    const meta = JSON.parse(fs.readFileSync(path.join(d, 'meta.json'), 'utf8'));
    const rd = (f) => (fs.existsSync(path.join(d, f)) ? JSON.parse(fs.readFileSync(path.join(d, f), 'utf8')) : null);
    const cold = rd('cold.json'), other = rd('other.json'), warm = rd('warm.json'), plain = rd('plain.json');
    const delta = (pre, post, m) => {
      const x = metric(path.join(d, pre), m), y = metric(path.join(d, post), m);
      return x === null || y === null ? null : y - x;
    };
    const row = {
      cold: cold?.ttft_ms, other: other?.ttft_ms, warm: warm?.ttft_ms, plain: plain?.ttft_ms,
      b_kv_hits: delta('metrics-B-before.txt', 'metrics-B-after.txt', 'sparq_kv_dir_hits_total'),
      b_prefill: delta('metrics-B-before.txt', 'metrics-B-after.txt', 'sparq_prefill_tokens_total'),
      a_pc_hits: delta('metrics-A-cold.txt', 'metrics-A-warm.txt', 'sparq_prefix_cache_hits_total'),
      a_writes: delta('metrics-A-before.txt', 'metrics-A-cold.txt', 'sparq_kv_dir_writes_total'),
      file_bytes: null,
    };
    // kvfiles.txt: "<name> <size> <allocated bytes>" per file after A's first question
    const kf = path.join(d, 'kvfiles.txt');
    const files = fs.existsSync(kf) ? fs.readFileSync(kf, 'utf8').trim().split('\n').filter(Boolean).map((l) => l.split(' ')) : [];
    if (files.length === 1) row.file_bytes = +files[0][2];
    else problems.push(`${name}: ${files.length} files in the kv-dir after A's first question (1 expected)`);
    if (row.b_kv_hits !== 1) problems.push(`${name}: B's sparq_kv_dir_hits_total rose by ${row.b_kv_hits} (1 expected: B loaded the file)`);
    if (row.a_pc_hits !== 1) problems.push(`${name}: A's sparq_prefix_cache_hits_total rose by ${row.a_pc_hits} on the second question (1 expected)`);
    const key = `${meta.model}|${meta.doc_tokens}`;
    if (!groups.has(key)) groups.set(key, { meta, rows: [] });
    groups.get(key).rows.push(row);
  }
  const stat = (xs) => {
    const v = xs.filter((x) => typeof x === 'number').sort((p, q) => p - q);
    if (!v.length) return null;
    const mid = v.length >> 1;
    return { med: v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2, min: v[0], max: v[v.length - 1], n: v.length };
  };
  const fmt = (s, d = 0, unit = '') => (s ? (s.n > 1 ? `${s.med.toFixed(d)}${unit} (${s.min.toFixed(d)}-${s.max.toFixed(d)})` : `${s.med.toFixed(d)}${unit}`) : '-');
  const hasPlain = [...groups.values()].some((g) => g.rows.some((r) => typeof r.plain === 'number'));
  const lines = [];
  lines.push(`| model | doc tokens | reps | cold TTFT ms |${hasPlain ? ' cold, no kv-dir ms |' : ''} other replica's file ms | warm (same replica) ms | speedup other | speedup warm |${hasPlain ? ' speedup other vs no kv-dir |' : ''} B kv_dir hits | B tokens prefilled | file MiB (on disk) |`);
  lines.push(`|---|---:|---:|---:|${hasPlain ? '---:|' : ''}---:|---:|---:|---:|${hasPlain ? '---:|' : ''}---:|---:|---:|`);
  for (const { meta, rows } of [...groups.values()].sort((x, y) => x.meta.order - y.meta.order)) {
    const col = (k) => stat(rows.map((r) => r[k]));
    // speedups per repetition (cold / other of the same run), then their median
    const sp = (k, base = 'cold') => stat(rows.map((r) => (r[base] && r[k] ? r[base] / r[k] : null)));
    const hits = rows.map((r) => r.b_kv_hits ?? '?').join('/');
    const pre = rows.map((r) => r.b_prefill ?? '?').join('/');
    const mib = stat(rows.map((r) => (r.file_bytes === null ? null : r.file_bytes / 1048576)));
    lines.push(`| ${meta.model} | ${meta.doc_tokens} | ${rows.length} | ${fmt(col('cold'))} |${hasPlain ? ` ${fmt(col('plain'))} |` : ''} ` +
      `${fmt(col('other'))} | ${fmt(col('warm'))} | ${fmt(sp('other'), 1, 'x')} | ${fmt(sp('warm'), 1, 'x')} |${hasPlain ? ` ${fmt(sp('other', 'plain'), 1, 'x')} |` : ''} ${hits} | ${pre} | ${fmt(mib, 1)} |`);
  }
  lines.push('');
  lines.push('Times are medians over the repetitions with (min-max); a speedup is cold / that TTFT within one repetition, then the median ' +
    '("vs no kv-dir": the cold TTFT of the replica without --kv-dir and prefix cache / B\'s). ' +
    '"B kv_dir hits" and "B tokens prefilled" are the rise of B\'s /metrics counters over its question, one value per repetition ' +
    '(1 hit and only the question\'s tokens prefilled: B loaded the file instead of prefilling the document).');
  if (problems.length) {
    lines.push('');
    lines.push('**Problems** (a row they affect does not measure what its column says):');
    for (const p of problems) lines.push(`- ${p}`);
  }
  process.stdout.write(lines.join('\n') + '\n');
}

const a = parseArgs(process.argv.slice(2));
const cmd = a._[0];
if (cmd === 'prepare') await prepare(a);
else if (cmd === 'ask') await ask(a);
else if (cmd === 'report') report(a);
else die('usage: bench_kvdir_client.mjs prepare|ask|report ... (see the comment at the top)');
