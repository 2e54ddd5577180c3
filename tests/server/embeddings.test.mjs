// embeddings.test.mjs - the official openai npm client's embeddings.create
// against `sparq serve --embedding`. Run by tests/test_embed_server.c:
//   node embeddings.test.mjs BASE_URL EXPECT.json
// EXPECT.json: the server's own float response for INPUTS (its "inputs"
// member added), which the client's default request (base64, decoded by
// the client) and an explicit float request must reproduce exactly.
// Prints "ok NAME" / "not ok NAME: why" per check, "embeddings: N passed, M failed" last.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const [baseURL, expectPath] = process.argv.slice(2);
const expect = JSON.parse(readFileSync(expectPath, 'utf8'));
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 120000 });
let pass = 0, fail = 0;
function check(cond, name, why = '') {
  if (cond) { pass++; console.log(`ok ${name}`); }
  else { fail++; console.log(`not ok ${name}: ${why}`); }
}
const same = (a, b) => a.length === b.length && a.every((x, i) => Math.fround(x) === Math.fround(b[i]));

for (const format of [undefined, 'float']) {
  const name = format ?? 'default (base64)';
  const body = { model: 'stories260K', input: expect.inputs };
  if (format) body.encoding_format = format;
  const r = await client.embeddings.create(body);
  check(r.object === 'list' && r.data.length === expect.data.length, `${name}: shape`, JSON.stringify(r).slice(0, 200));
  r.data.forEach((d, i) => check(d.index === i && same(d.embedding, expect.data[i].embedding),
                                 `${name}: vector ${i} equals the float response`));
  check(r.usage.prompt_tokens === expect.usage.prompt_tokens, `${name}: usage`, JSON.stringify(r.usage));
}
try {
  await client.embeddings.create({ model: 'stories260K', input: '' });
  check(false, 'empty input is an error');
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && /empty/.test(e.message), 'empty input is a 400', String(e));
}
console.log(`embeddings: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
