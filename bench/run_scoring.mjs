// What log-probabilities cost in `ellm serve`: scoring a prompt (echo with
// logprobs and max_tokens 0, as lm-evaluation-harness's local-completions
// asks) against a plain prefill of the same length, and streams generating
// with `logprobs: 5` against without. One server on 127.0.0.1; every request
// is bounded and the run stops by itself.
//
//   node bench/run_scoring.mjs --model /tmp/smollm2-135m-q8_0.gguf
//       [--ellm build/ellm] [--threads 2] [--prompts 128,512,1024]
//       [--levels 1,16] [--decode-tokens 128] [--rounds 3] [--no-write]
//
// Prompts are random token ids, new for every request, so no slot's cached
// prefix serves them. Within a round, the two modes of each point run back to
// back (scoring first in odd rounds, plain first in even ones). Writes
// bench/results/scoring-<UTC time>.json and the table between the scoring
// markers of bench/SERVING.md (`--from FILE.json` re-renders without
// measuring).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';

const HERE = path.dirname(new URL(import.meta.url).pathname);
const ROOT = path.dirname(HERE);
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : '1']);
  return acc;
}, []));
const cfg = {
  model: args.model,
  ellm: args.ellm || path.join(ROOT, 'build', 'ellm'),
  threads: String(args.threads || '2'),
  prompts: (args.prompts || '128,512,1024').split(',').map(Number),
  levels: (args.levels || '1,16').split(',').map(Number),
  decodeTokens: Number(args['decode-tokens'] || 128),
  rounds: Number(args.rounds || 3),
  vocab: Number(args.vocab || 2000),
};
const REQUEST_TIMEOUT_MS = 180000;
const log = (...a) => console.error(new Date().toISOString().slice(11, 19), ...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (a) => {
  const s = a.filter((x) => x !== null && !Number.isNaN(x)).sort((x, y) => x - y);
  return s.length ? s[Math.floor(s.length / 2)] : null;
};
let seed = 4242;
const rnd = () => (seed = (seed * 1103515245 + 12345) & 0x7fffffff);
const randomPrompt = (n) => Array.from({ length: n }, () => 1 + (rnd() % (cfg.vocab - 1)));
const MARK_BEGIN = '<!-- scoring:begin (bench/run_scoring.mjs writes this part) -->';
const MARK_END = '<!-- scoring:end -->';

function post(base, body) {
  return new Promise((resolve, reject) => {
    const u = new URL('/v1/completions', base), data = JSON.stringify(body);
    const req = http.request({ hostname: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent: false,
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data), Connection: 'close' } }, resolve);
    req.on('error', reject);
    req.end(data);
  });
}

// A whole (not streamed) completion: its wall time and body.
async function whole(base, body) {
  const t0 = performance.now();
  const res = await post(base, body);
  let text = '';
  for await (const c of res) text += c;
  if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}: ${text}`);
  return { ms: performance.now() - t0, json: JSON.parse(text) };
}

// A streamed completion: the arrival times of its token chunks.
async function streamed(base, body) {
  const res = await post(base, { ...body, stream: true });
  if (res.statusCode !== 200) throw new Error(`HTTP ${res.statusCode}`);
  const dec = new TextDecoder();
  let buf = '';
  const times = [];
  for await (const chunk of res) {
    buf += dec.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const c = JSON.parse(ev.slice(6)).choices?.[0];
      if (c && typeof c.text === 'string' && !(c.finish_reason && !c.text)) times.push(performance.now());
    }
  }
  return times;
}

// Prompt tokens per second: plain prefill (max_tokens 1) or scoring (echo,
// logprobs 1, max_tokens 0) of a new random prompt of n tokens.
async function promptRate(base, n, scoring) {
  const body = scoring ? { prompt: randomPrompt(n), max_tokens: 0, echo: true, logprobs: 1 }
    : { prompt: randomPrompt(n), max_tokens: 1, temperature: 0 };
  const r = await whole(base, body);
  if (scoring && r.json.choices[0].logprobs.token_logprobs.length !== n) throw new Error('scoring returned the wrong count');
  return (n * 1000) / r.ms;
}

// Aggregate tokens/s of c streams while all generate (as run_serving.mjs's decode phase).
async function decodeRate(base, c, lp) {
  const body = { max_tokens: cfg.decodeTokens, temperature: 0, ignore_eos: true, ...(lp ? { logprobs: 5 } : {}) };
  const res = await Promise.all(Array.from({ length: c }, () => streamed(base, { ...body, prompt: randomPrompt(32) })));
  const from = Math.max(...res.map((t) => t[0])), to = Math.min(...res.map((t) => t[t.length - 1]));
  let tokens = 0;
  for (const t of res) tokens += t.filter((x) => x > from && x <= to).length;
  return to > from ? (tokens * 1000) / (to - from) : null;
}

async function measure() {
  const argv = ['serve', '-m', cfg.model, '--port', '0', '-t', cfg.threads, '--parallel', String(Math.max(...cfg.levels)),
    '-c', String(Math.max(...cfg.prompts) + cfg.decodeTokens + 64)];
  log('$', cfg.ellm, argv.join(' '));
  const proc = spawn(cfg.ellm, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  let out = '';
  const base = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start: ' + out)), 120000);
    proc.stderr.on('data', (d) => {
      out = (out + d).slice(-4000);
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(`http://127.0.0.1:${m[1]}`); }
    });
  });
  try {
    for (let i = 0; i < 600 && (await fetch(base + '/health')).status !== 200; i++) await sleep(100);
    await whole(base, { prompt: randomPrompt(64), max_tokens: 4 }); // warm-up
    const rounds = [];
    for (let r = 0; r < cfg.rounds; r++) {
      const order = r % 2 ? [false, true] : [true, false];
      const prompt = [], decode = [];
      for (const n of cfg.prompts) {
        const rate = {};
        for (const scoring of order) rate[scoring ? 'scoring' : 'prefill'] = await promptRate(base, n, scoring);
        prompt.push({ tokens: n, ...rate });
        log(`round ${r + 1}: ${n}-token prompt: prefill ${rate.prefill.toFixed(0)}, scoring ${rate.scoring.toFixed(0)} tok/s`);
      }
      for (const c of cfg.levels) {
        const rate = {};
        for (const lp of order) rate[lp ? 'logprobs' : 'plain'] = await decodeRate(base, c, lp);
        decode.push({ streams: c, ...rate });
        log(`round ${r + 1}: ${c} streams: plain ${rate.plain?.toFixed(1)}, logprobs 5 ${rate.logprobs?.toFixed(1)} tok/s`);
      }
      rounds.push({ prompt, decode, loadavg: os.loadavg() });
    }
    return { cmd: [cfg.ellm, ...argv], rounds };
  } finally {
    proc.kill('SIGTERM');
    await sleep(300);
  }
}

function render(R) {
  const L = [];
  const w = (s = '') => L.push(s);
  const rs = R.rounds;
  const f = (x, d = 0) => (x === null || x === undefined ? '—' : x.toFixed(d));
  // a row per point: the medians over the rounds of fields a and b, and b ÷ a
  const ratioTable = (head, points, samples, a, b, digits) => {
    w(head);
    w('|---:|---:|---:|---:|');
    points.forEach((x, i) => {
      const ma = median(samples(i).map((v) => v[a])), mb = median(samples(i).map((v) => v[b]));
      w(`| ${x} | ${f(ma, digits)} | ${f(mb, digits)} | ${ma && mb ? (mb / ma).toFixed(2) : '—'} |`);
    });
  };
  w(MARK_BEGIN);
  w('## What log-probabilities cost');
  w();
  w(`From one run of \`node bench/run_scoring.mjs\` (raw results: \`${path.relative(HERE, R.json_path)}\`), ${rs.length} rounds, medians:`);
  w(`\`ellm serve\` on \`${path.basename(R.config.model)}\`, ${R.config.threads} threads; ${R.machine}.`);
  w();
  w('Scoring a prompt (`echo`, `logprobs: 1`, `max_tokens: 0`: the log-probability of every prompt token, from the');
  w('logits of every row of its prefill passes) against a plain prefill of the same length (`max_tokens: 1`), prompt');
  w('tokens per second from the request\'s wall time:');
  w();
  ratioTable('| prompt tokens | prefill tok/s | scoring tok/s | scoring ÷ prefill |', cfg.prompts, (i) => rs.map((r) => r.prompt[i]),
    'prefill', 'scoring', 0);
  w();
  w(`Streams generating ${R.config.decodeTokens} tokens each, with \`logprobs: 5\` (a log-softmax over the vocabulary and the`);
  w('5 likeliest tokens for every token, on the engine thread) and without; aggregate tokens/s while all generate:');
  w();
  ratioTable('| streams | without tok/s | logprobs 5 tok/s | with ÷ without |', cfg.levels, (i) => rs.map((r) => r.decode[i]),
    'plain', 'logprobs', 1);
  w();
  w('```sh');
  w(`node bench/run_scoring.mjs --model ${R.config.model}`);
  w('```');
  w(MARK_END);
  return L.join('\n');
}

function write(R, section) {
  const file = path.join(HERE, 'SERVING.md');
  const text = fs.readFileSync(file, 'utf8');
  const a = text.indexOf(MARK_BEGIN), b = text.indexOf(MARK_END);
  const next = a >= 0 && b > a ? text.slice(0, a) + section + text.slice(b + MARK_END.length) : text.trimEnd() + '\n\n' + section + '\n';
  fs.writeFileSync(file, next);
  log('wrote', file);
}

async function main() {
  if (args.from) {
    const R = JSON.parse(fs.readFileSync(args.from, 'utf8'));
    R.json_path = path.resolve(args.from);
    Object.assign(cfg, R.config);
    const section = render(R);
    if (args['no-write']) console.log(section);
    else write(R, section);
    return;
  }
  if (!cfg.model) throw new Error('--model FILE.gguf is required');
  let machine = `${os.cpus().length} CPUs`;
  try {
    const p = JSON.parse(execFileSync(cfg.ellm, ['probe', '--json'], { encoding: 'utf8', timeout: 120000 }));
    const bw = (p.numa_nodes || []).map((n) => n.read_gbps).filter(Boolean);
    machine = `${p.physical_cores ?? '?'} cores, ${p.isa ?? '?'} kernels, read bandwidth ${bw.length ? bw.join(' + ') + ' GB/s' : 'not probed'} (\`ellm probe\`, start of the run)`;
  } catch { /* the figure is optional */ }
  const R = { config: cfg, machine, started: new Date().toISOString(), ...(await measure()) };
  const stamp = R.started.replace(/[-:]/g, '').slice(0, 13);
  R.json_path = path.join(HERE, 'results', `scoring-${stamp}.json`);
  const section = render(R);
  if (args['no-write']) {
    console.log(section);
    return;
  }
  fs.mkdirSync(path.dirname(R.json_path), { recursive: true });
  fs.writeFileSync(R.json_path, JSON.stringify({ ...R, json_path: undefined }, null, 1));
  write(R, section);
}

main().catch((e) => { console.error(e); process.exit(1); });
