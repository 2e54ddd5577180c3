// bench_http.mjs - what the benchmark clients (bench_serve_client.mjs,
// bench_kvdir_client.mjs) share: option parsing, one HTTP request through
// node:http (not fetch: fetch gives up after 300 s without response headers,
// and a long prefill on 2 cores takes longer), /tokenize, id ranges.
// Node 20, built-in modules only.
import http from 'node:http';
import { StringDecoder } from 'node:string_decoder';

let progName = 'bench';

// Sets the name die() prints in front of its message.
export function setProgName(name) { progName = name; }

export function die(msg) {
  process.stderr.write(`${progName}: ${msg}\n`);
  process.exit(1);
}

export function parseArgs(argv) {
  const a = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const s = argv[i];
    if (s.startsWith('--')) {
      const k = s.slice(2);
      if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) a[k] = argv[++i];
      else a[k] = true;
    } else a._.push(s);
  }
  return a;
}

const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

// One HTTP request; onData gets each body chunk (for streams), the promise
// the status and the whole body when onData is not given.
export function request(url, method, body, onData) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request({
      host: u.hostname, port: u.port, path: u.pathname, method, agent,
      headers: data ? { 'Content-Type': 'application/json', 'Content-Length': data.length } : {},
    }, (res) => {
      const parts = [];
      res.on('data', (c) => { if (onData && res.statusCode === 200) onData(c); else parts.push(c); });
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(parts).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

export async function tokenize(url, text, addSpecial) {
  const r = await request(`${url}/tokenize`, 'POST', { content: text, add_special: addSpecial });
  if (r.status !== 200) die(`POST ${url}/tokenize: HTTP ${r.status}: ${r.body.slice(0, 200)}`);
  const j = JSON.parse(r.body);
  if (!Array.isArray(j.tokens)) die(`POST ${url}/tokenize: no "tokens" array in the answer`);
  // llama-server may answer objects ({id, piece}) when asked for pieces; plain ids here
  return j.tokens.map((t) => (typeof t === 'number' ? t : t.id));
}

// "3-258,300" -> [3, ..., 258, 300]
export function parseIds(spec) {
  const ids = [];
  for (const part of String(spec).split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!m) die(`--ban-tokens: '${part}' is not an id or a range LO-HI`);
    const lo = +m[1], hi = m[2] === undefined ? lo : +m[2];
    if (hi < lo || hi - lo > 1e6) die(`--ban-tokens: bad range '${part}'`);
    for (let i = lo; i <= hi; i++) ids.push(i);
  }
  return ids;
}

// A streamed /v1/completions answer (server-sent events). Returns s with
// s.onData for request(); onText(now, text) gets every event with text,
// onFirst(now) (optional) every `data:` line; s.error, s.finish and s.tokens
// (usage.completion_tokens) hold what the stream said. now: ms since t0.
export function completionStream(t0, onText, onFirst) {
  const s = { error: null, finish: null, tokens: null };
  let buf = '';
  const dec = new StringDecoder('utf8'); // a character may be split across reads
  s.onData = (chunk) => {
    const now = performance.now() - t0;
    buf += dec.write(chunk);
    let k;
    while ((k = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      for (const line of ev.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        if (onFirst) onFirst(now);
        const payload = line.slice(6).trim();
        if (payload === '[DONE]') continue;
        let j;
        try { j = JSON.parse(payload); } catch { s.error = `unparsable event: ${payload.slice(0, 100)}`; continue; }
        if (j.error) { s.error = `error event: ${JSON.stringify(j.error).slice(0, 200)}`; continue; }
        const c = j.choices && j.choices[0];
        if (c && typeof c.text === 'string' && c.text.length) onText(now, c.text);
        if (c && c.finish_reason) s.finish = c.finish_reason;
        if (j.usage && typeof j.usage.completion_tokens === 'number') s.tokens = j.usage.completion_tokens;
      }
    }
  };
  return s;
}
