// Serving benchmark: aggregate generated tokens/s, time to first token and
// inter-token latency at several numbers of concurrent streams, against a
// server this script starts on 127.0.0.1 (loopback only): `ellm serve` or
// llama.cpp's llama-server, on the same GGUF file, with the same load.
//
//   node bench/serve_bench.mjs --model /tmp/smol.gguf [--server ellm|llama]
//       [--bin PATH] [--levels 1,4,16] [--requests 2] [--prompt-tokens 64]
//       [--max-tokens 64] [--threads 2] [--ctx 512]
//
// Each level runs C clients at once, each sending --requests streamed
// completions one after another; prompts are arrays of random token ids
// (no tokenizer in the way), generation runs to max_tokens (ignore_eos).
// No dependencies beyond Node 18+.
import { spawn } from 'node:child_process';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : '1']);
  return acc;
}, []));
const server = args.server || 'ellm';
const model = args.model;
if (!model) { console.error('--model FILE is required'); process.exit(2); }
const levels = (args.levels || '1,4,16').split(',').map(Number);
const requests = Number(args.requests || 2);
const promptTokens = Number(args['prompt-tokens'] || 64);
const maxTokens = Number(args['max-tokens'] || 64);
const threads = args.threads || '2';
const ctx = Number(args.ctx || 512);
const nVocab = Number(args.vocab || 2000);
const maxLevel = Math.max(...levels);

let seed = 12345;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff);

function start() {
  let bin, argv;
  if (server === 'ellm') {
    bin = args.bin || 'build/ellm';
    argv = ['serve', '-m', model, '--port', '0', '-t', threads, '--parallel', String(maxLevel), '-c', String(ctx)];
  } else {
    bin = args.bin || '/tmp/llama.cpp/build/bin/llama-server';
    // llama-server splits -c over its slots
    argv = ['-m', model, '--port', String(18000 + (process.pid % 1000)), '--host', '127.0.0.1', '-t', threads,
      '-np', String(maxLevel), '-c', String(ctx * maxLevel), '-cb'];
  }
  const proc = spawn(bin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log.slice(-2000))), 60000);
    const onData = (d) => {
      log += d;
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/) || log.match(/server is listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve({ proc, base: `http://127.0.0.1:${m[1]}` }); }
    };
    proc.stdout.on('data', onData);
    proc.stderr.on('data', onData);
    proc.on('exit', (c) => reject(new Error(`server exited (${c}):\n${log.slice(-2000)}`)));
  });
}

async function waitHealthy(base) {
  for (let i = 0; i < 600; i++) {
    try { if ((await fetch(base + '/health')).status === 200) return; } catch { /* starting */ }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('server never became healthy');
}

// One streamed completion: returns {ttft, gaps[], tokens}.
async function one(base) {
  const prompt = Array.from({ length: promptTokens }, () => 1 + (rnd() % (nVocab - 1)));
  const t0 = performance.now();
  const res = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
  });
  if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  const dec = new TextDecoder();
  let buf = '', last = 0, ttft = null, tokens = 0, usage = null;
  const gaps = [];
  for await (const chunk of res.body) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage && j.usage.completion_tokens) usage = j.usage.completion_tokens;
      const c = j.choices && j.choices[0];
      if (!c || c.finish_reason || typeof c.text !== 'string') continue; // a token's chunk (its text may be empty)
      const now = performance.now();
      if (ttft === null) ttft = now - t0; else gaps.push(now - last);
      last = now;
      tokens++;
    }
  }
  return { ttft, gaps, tokens: usage || tokens };
}

const pct = (a, p) => { if (!a.length) return NaN; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };

async function main() {
  const { proc, base } = await start();
  try {
    await waitHealthy(base);
    await one(base); // warm-up
    const rows = [];
    for (const c of levels) {
      const t0 = performance.now();
      const results = (await Promise.all(Array.from({ length: c }, async () => {
        const out = [];
        for (let r = 0; r < requests; r++) out.push(await one(base));
        return out;
      }))).flat();
      const wall = (performance.now() - t0) / 1000;
      const toks = results.reduce((s, r) => s + r.tokens, 0);
      const ttft = results.map((r) => r.ttft), gaps = results.flatMap((r) => r.gaps);
      rows.push({ streams: c, requests: results.length, tokens: toks, tok_s: toks / wall,
        ttft_p50_ms: pct(ttft, 50), ttft_p99_ms: pct(ttft, 99), itl_p50_ms: pct(gaps, 50), itl_p99_ms: pct(gaps, 99) });
    }
    console.log(`# ${server} ${model}: prompt ${promptTokens} tokens, ${maxTokens} generated, ${requests} requests per stream, ${threads} threads`);
    console.log('| streams | requests | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |');
    console.log('| ---: | ---: | ---: | ---: | ---: | ---: | ---: |');
    for (const r of rows)
      console.log(`| ${r.streams} | ${r.requests} | ${r.tok_s.toFixed(1)} | ${r.ttft_p50_ms.toFixed(1)} | ${r.ttft_p99_ms.toFixed(1)} | ${r.itl_p50_ms.toFixed(1)} | ${r.itl_p99_ms.toFixed(1)} |`);
  } finally {
    proc.kill('SIGTERM');
  }
}

main().catch((e) => { console.error(e.message); process.exit(1); });
